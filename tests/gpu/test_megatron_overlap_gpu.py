"""Issue 39 on a GPU: the optimizer state's trips on a side CUDA stream (adapters/megatron/overlap.py) bring back every
byte while the compute stream works and reuses the freed memory, and the device memory really goes and comes back.

A Qwen2.5-0.5B-shaped random model cut to 8 layers (bf16, distributed optimizer, fused AdamW). After one update (Adam's
state exists), round trips as the hybrid engine makes them (begin_offload after the update, offload at push), with
the onload sent for at the "update's start" (none, half, all of it), then compute-stream work that allocates and
writes over the freed memory, then the wait before the step: the state must equal its snapshot bitwise. The math
of an update after such a trip is checked bitwise on the CPU (tests/dist/test_megatron_overlap_update.py: two GPU
runs of the same update need not agree bitwise, whatever the copies do); here an overlapped update runs and reports.
`python -m pytest tests/gpu/test_megatron_overlap_gpu.py -s`.
"""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("megatron.core")

SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=8, num_attention_heads=14,
             num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643)
SAMPLES, PROMPT, RESPONSE = 16, 64, 128


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = str(tmp_path_factory.mktemp("qwen2_8l"))
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**SHAPE)).to(torch.bfloat16).save_pretrained(path)
    return path


def _data():
    from hybridrl.protocol import DataProto

    g = torch.Generator().manual_seed(1)
    T = PROMPT + RESPONSE
    ids = torch.randint(10, SHAPE["vocab_size"] - 10, (SAMPLES, T), generator=g)
    mask = torch.ones(SAMPLES, T, dtype=torch.long)
    resp = torch.ones(SAMPLES, RESPONSE)
    data = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1,
                                "responses": ids[:, PROMPT:].clone(), "response_mask": resp},
                               meta_info={"temperature": 1.0})
    data.batch["old_log_probs"] = -5.0 + 0.1 * torch.randn(SAMPLES, RESPONSE, generator=g)
    data.batch["advantages"] = torch.randn(SAMPLES, RESPONSE, generator=g)
    return data


@pytest.fixture(scope="module")
def actor(hf_dir, layout):
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    cfg = ActorConfig(ppo_mini_batch_size=SAMPLES, ppo_micro_batch_size_per_gpu=4, loss_agg_mode="token-mean",
                      use_kl_loss=False, optim=OptimConfig(lr=1e-4, clip_grad=1.0, total_training_steps=10),
                      megatron=MegatronConfig(use_distributed_optimizer=True, sequence_parallel=False, seed=1))
    plan = BatchPlan(samples_per_step=SAMPLES, mini_batch_samples=SAMPLES, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=SAMPLES, micro_batch_per_gpu=4, grad_accum=SAMPLES // 4, use_dynamic_bsz=False,
                     max_token_len_per_gpu=8192, forward_micro_batch_per_gpu=8, forward_max_token_len_per_gpu=8192)
    role = MegatronActor(ModelConfig(path=hf_dir), cfg, layout, plan)
    role.prepare_offload(params=False, grads=True, optimizer=True, onload_reserve=0)
    role.update_policy(_data())  # Adam's state appears (its arena was reserved for it in the background)
    yield role
    del role
    torch.cuda.empty_cache()


def _state(actor) -> dict[str, torch.Tensor]:
    from hybridrl.adapters.megatron import offload

    out = {}
    for i, inner in enumerate(offload._inner_optimizers(actor.engine)):
        for g, group in enumerate(inner.param_groups):
            for j, p in enumerate(group["params"]):
                out[f"main.{i}.{g}.{j}"] = p.detach()
                out.update({f"state.{i}.{g}.{j}.{k}": v.detach() for k, v in inner.state[p].items()})
    return out


def _busy_compute_stream(nbytes: int) -> None:
    """Work queued on the compute stream that allocates about `nbytes` (the freed state's memory, and more) and writes
    all of it: were a copy still reading or writing such a block, this would corrupt it."""
    blocks = [torch.full((64 << 20,), 7.0, device="cuda") for _ in range(max(1, nbytes // (256 << 20)))]
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        a = a @ a / 64.0
    del blocks, a


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_a_round_trip_brings_back_every_byte_while_the_compute_stream_works(actor, share):
    from hybridrl.adapters.megatron import overlap

    before = {k: v.clone() for k, v in _state(actor).items()}
    actor.begin_offload(params=False, optimizer=True)
    _busy_compute_stream(1 << 30)  # while the copies to the host run (the storages are still allocated)
    allocated = torch.cuda.memory_allocated()
    off = actor.offload(params=False, grads=False, optimizer=True)
    assert allocated - torch.cuda.memory_allocated() >= 0.95 * off.optimizer_bytes
    _busy_compute_stream(off.optimizer_bytes)  # the rollout engine takes the memory
    budget = int(share * off.optimizer_bytes)
    actor._onload_budget = overlap.OverlapBudget(reserve=0, free=lambda: budget)
    actor._onload = overlap.Moved()
    actor._begin_optimizer_onload()
    _busy_compute_stream(1 << 30)  # the forward/backward
    actor._optimizer_on_device()
    after = _state(actor)
    differ = [k for k, v in before.items() if not torch.equal(v, after[k])]
    assert not differ, f"share {share}: {len(differ)} tensors differ after the round trip, e.g. {differ[:3]}"
    assert actor._onload.nbytes == off.optimizer_bytes
    assert abs(actor._onload.overlapped_bytes / off.optimizer_bytes - share) < 0.1


def test_an_overlapped_update_runs_and_says_what_it_waited_for(actor):
    from hybridrl.adapters.megatron import overlap

    actor.overlap_onload(0)  # all of it at the update's start
    actor.begin_offload(params=False, optimizer=True)
    off = actor.offload(params=False, grads=True, optimizer=True)
    actor.onload(params=False, grads=True, optimizer=False)
    m = actor.update_policy(_data())
    print(f"\n[overlap gpu] offload {off}; update " + json.dumps({k: v for k, v in m.items() if "onload" in k}))
    assert torch.isfinite(torch.tensor(m["actor/pg_loss"])) and m["offload/optimizer_onload_overlap"] == 1.0
    assert off.optimizer_seconds > 0 and m["timing_s/optimizer_onload"] > 0
    assert m["timing_s/optimizer_onload_exposed"] < m["timing_s/optimizer_onload"]  # some of it ran beside the work
    actor.begin_offload(params=False, optimizer=True)  # a checkpoint before the next push: the offload stops
    actor._optimizer_on_device()
    assert not actor._offloaded.leaving and not actor._offloaded.offloaded["optimizer"]
    assert isinstance(actor._onload_budget, overlap.OverlapBudget)
