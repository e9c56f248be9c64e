"""vLLM with LoRA adapters in the hybrid engine on one GPU (issue 40, hybridrl/rollout/vllm_lora.py): the base loaded
once, adapters synced alone each step and updated in place, against transformers on the same weights.

A tiny random Llama; a stub actor exports the base (bf16, CUDA) and PEFT-named adapters; WeightSync runs as the
hybrid worker runs it (push, generate, release, with its checks). Three adapter versions:
  v1  through vLLM's own loader (an in-memory LoRAModel), then the slots proven for the in-place write
  v2, v3  written in place
Each version's rollout log-probs (temperature 1) are compared with teacher-forced log-probs of fp32 transformers with
W + (alpha/r) B A, against the bf16 floor (our torch engine in bf16 with the same adapters on hooks, vs the same fp32
reference) and against the previous version's weights (the engine must not run stale adapters); with peft installed,
the fp32 reference is also checked against transformers + peft. The engine keeps its base on the GPU while asleep
(base_resident, hybridrl/rollout/vllm_kv_sleep.py): every sleep frees the KV cache alone, the weights' allocations stay
mapped with no host copy, vLLM's level-1 sleep never runs, and generation after each wake is at the floor. Skipped
without CUDA or vLLM."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

RANK, ALPHA = 8, 12.0  # scaling 1.5: vLLM's pre-scaled B is rounded, the checks must say so exactly
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS, N, MAX_TOKENS, VOCAB = 16, 2, 32, 4096


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=False, eos_token_id=1, pad_token_id=0, initializer_range=0.06)


def _adapters(model, seed: int) -> dict[str, torch.Tensor]:
    from hybridrl.rollout.lora import peft_name

    g = torch.Generator().manual_seed(seed)
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in TARGETS:
            out[peft_name(path, "A")] = (torch.randn(RANK, m.in_features, generator=g) / m.in_features ** 0.5)
            out[peft_name(path, "B")] = torch.randn(m.out_features, RANK, generator=g) * 0.05
    return {n: t.to("cuda", torch.bfloat16) for n, t in out.items()}


def _merged_fp32(base: dict, adapters: dict) -> dict:
    from hybridrl.rollout.lora import peft_module, peft_name

    out = {n: t.float().clone() for n, t in base.items()}
    for name, a in adapters.items():
        module, which = peft_module(name)
        if which == "A":
            out[f"{module}.weight"] += (ALPHA / RANK) * adapters[peft_name(module, "B")].float() @ a.float()
    return out


def _teacher(model, out) -> torch.Tensor:
    """Teacher-forced log-probs [rows, R] of the generated tokens (temperature 1)."""
    r = out.batch["responses"].shape[1]
    b = {k: out.batch[k].cuda() for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits[:, -r - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None])[..., 0]


def _gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool().cuda()
    return float((a.cuda() - b.cuda()).abs()[m].mean())


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    pytest.importorskip("vllm")
    from tests.fixtures.child import in_child  # one vLLM engine per process (tests/fixtures/child.py)

    return in_child(_lora_run, str(tmp_path_factory.mktemp("llama_lora")))


def _lora_run(folder: str) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from hybridrl.utils.net import free_port

    # vLLM's external launcher reads a torch.distributed world: rank 0 of 1 on a fresh port. Set, not defaulted: the
    # child inherits the pytest process's MASTER_PORT from earlier in-process groups, whose store still holds it
    # (EADDRINUSE in the one-command run, 4 x H200, 2026-11-28).
    port = free_port("127.0.0.1")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from transformers import AutoModelForCausalLM

    from hybridrl.hybrid import SyncOptions, WeightSync
    from hybridrl.protocol import DataProto
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.rollout.lora import RolloutLora
    from hybridrl.rollout.torch_engine import TorchRolloutEngine
    from hybridrl.rollout.vllm_kv_sleep import allocator_ops, tag_bytes
    from hybridrl.rollout.vllm_lora import VLLMLoraEngine
    from tests.fixtures.actor_stubs import StubActor

    cfg = _config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    model.save_pretrained(folder)
    base = {n: t.detach().clone() for n, t in model.state_dict().items()}
    spec = RolloutLora(RANK, ALPHA, TARGETS)

    class Actor(StubActor):
        adapters: dict = {}

        def export_weights(self, bucket_bytes, names=None):
            yield [(n, t) for n, t in base.items() if names is None or n in names]

        def export_adapter_weights(self, bucket_bytes):
            items = list(self.adapters.items())
            yield items[: len(items) // 2]
            yield items[len(items) // 2:]

    actor = Actor()
    engine = VLLMLoraEngine(folder, lora=spec, tp_size=1, gpu_memory_utilization=0.3, max_model_len=256,
                            max_num_seqs=64, pad_token_id=0, eos_token_ids=(1,), load_format="dummy",
                            cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32], base_resident=True)
    allocator = allocator_ops()[0]
    engine.sleep()
    asleep = [tag_bytes(allocator)]  # what each sleep kept: by tag, mapped / asleep / copied to the host
    sync = WeightSync(actor, engine, SyncOptions(adapters=True, bucket_bytes=1 << 20))
    hooked = TorchRolloutEngine(cfg, dtype=torch.bfloat16, device="cuda", lora=spec)  # the bf16 floor's engine
    hooked.load_weights(base.items())
    hooked.finish_weight_sync()
    reference = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).cuda().eval()

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (PROMPTS, 24), generator=g)
    mask = torch.ones_like(ids)
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1})
    rows, previous = [], None
    for version in (1, 2, 3):
        actor.adapters = _adapters(model, seed=version)
        metrics = sync.push(version)
        out = engine.generate(prompts, SamplingParams(n=N, temperature=1.0, max_tokens=MAX_TOKENS, seed=version,
                                                      ignore_eos=True))
        in_place = engine._in_place
        base_sums = engine.weight_checksums(["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"])
        sync.release()
        asleep.append(tag_bytes(allocator))
        reference.load_state_dict(_merged_fp32(base, actor.adapters))
        hooked.load_adapter(actor.adapters.items())
        hooked.finish_adapter_sync(version)
        want = _teacher(reference, out)
        row = {"version": version, "metrics": metrics, "in_place": in_place,
               "adapter_bytes": sum(t.numel() * t.element_size() for t in actor.adapters.values()),
               "base_sum_q": base_sums["model.layers.0.self_attn.q_proj.weight"],
               "gap": _gap(out.batch["rollout_log_probs"], want, out.batch["response_mask"]),
               "floor": _gap(_teacher(hooked.model, out), want, out.batch["response_mask"])}
        if previous is not None:
            reference.load_state_dict(_merged_fp32(base, previous))
            row["stale_gap"] = _gap(out.batch["rollout_log_probs"], _teacher(reference, out), out.batch["response_mask"])
        reference.load_state_dict({n: t.float() for n, t in base.items()})
        row["base_gap"] = _gap(out.batch["rollout_log_probs"], _teacher(reference, out), out.batch["response_mask"])
        try:
            import peft

            plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).cuda().eval()
            plain.load_state_dict({n: t.float() for n, t in base.items()})
            ref = peft.get_peft_model(plain, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS),
                                                             lora_dropout=0.0))
            loaded = peft.set_peft_model_state_dict(ref, {n: t.float() for n, t in actor.adapters.items()})
            assert not loaded.unexpected_keys, loaded.unexpected_keys[:3]
            row["peft_vs_merged"] = _gap(_teacher(ref, out), want, out.batch["response_mask"])
        except ImportError:
            pass
        rows.append(row)
        previous = actor.adapters
        print(f"[vllm lora] v{version}: {({k: v for k, v in row.items() if k != 'metrics'})}")
    # vLLM fuses q/k/v: the engine's sum under q_proj's name is qkv_proj's (checksum_terms names its members)
    q = "model.layers.0.self_attn.q_proj.weight"
    return {"rows": rows, "base_sum_q": sum(c * float(base[m].double().sum()) for m, c in engine.checksum_terms(q)),
            "asleep": asleep, "sleeps": dict(engine.sleeps)}


@pytest.mark.timeout(900)
def test_rollout_log_probs_with_adapters_are_at_the_bf16_floor(result):
    for row in result["rows"]:
        assert row["gap"] <= 1.5 * row["floor"] + 2e-3, row
        assert row["base_gap"] > 5 * row["gap"], row  # the adapters change the model and vLLM applies them
        assert row.get("peft_vs_merged", 0.0) < 1e-4, row


@pytest.mark.timeout(900)
def test_later_versions_are_written_in_place_and_used(result):
    first, *later = result["rows"]
    assert first["in_place"], "the slots did not prove: every version goes through vLLM's loader"
    for row in later:
        assert row["stale_gap"] > 5 * row["gap"], row  # generation used this version, not the one before


@pytest.mark.timeout(900)
def test_each_sync_moves_only_the_adapters_after_the_first(result):
    first, *later = result["rows"]
    assert first["metrics"]["reshard/bytes"] > first["adapter_bytes"]  # the base came with the first one
    for row in later:
        m = row["metrics"]
        assert m["reshard/bytes"] == m["reshard/adapter_bytes"] == row["adapter_bytes"], m
        assert m["sync_check/adapter_tensors_checked"] == 2 * 7 * 4, m  # A and B of 7 modules x 4 layers, checked
    for row in result["rows"]:  # the base, read back under its HF name through the LoRA wrapper, never moved
        assert row["base_sum_q"] == pytest.approx(result["base_sum_q"], rel=1e-6), row


@pytest.mark.timeout(900)
def test_the_base_stays_on_the_gpu_while_the_engine_sleeps(result):
    """Every sleep (after start-up and after each version's generation) released the KV cache alone: the weights'
    allocations (base and adapter slots) stayed mapped and were never copied to the host; vLLM's level-1 sleep never
    ran; waking the weights before each sync mapped and copied nothing (engine_wake_weights, a few ms at most)."""
    assert result["sleeps"] == {"kv_only": 4, "level1": 0}, result["sleeps"]
    for state in result["asleep"]:
        weights, kv = state["weights"], state["kv_cache"]
        assert weights["mapped"] > 0 and weights["asleep"] == weights["host_copy"] == 0, state
        assert kv["mapped"] == 0 and kv["asleep"] > 0 and kv["host_copy"] == 0, state
    for row in result["rows"]:
        assert row["metrics"]["timing_s/engine_wake_weights"] < 0.01, row["metrics"]
