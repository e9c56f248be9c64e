"""Partial rollout on the real torch engine: a weight sync between segments, tokens tagged with the version that
sampled them, and the rollout correction of a stale sample computed against each token's own version.

References: float64 transformers copies of the weights of each version, teacher-forced on the generated samples.
"""
import math
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from hybridrl.algos import RolloutCorrection, rollout_correction
from hybridrl.protocol import DataProto
from hybridrl.rollout.async_queue import SampleQueue, load_spilled, staleness_metrics, version_span
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.continuous import VERSIONS_KEY, ContinuousRollout
from hybridrl.rollout.torch_engine import TorchRolloutEngine

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, eos_token_id=1, pad_token_id=0,
                  tie_word_embeddings=False)
TEMPERATURE = 0.9
RESPONSE, SEGMENT, N = 6, 2, 2


def weights(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CFG, dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference_log_probs(state: dict, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[B, R] float64 log-probs of each response token at TEMPERATURE under `state`."""
    model = AutoModelForCausalLM.from_config(CFG, dtype=torch.float64)
    model.load_state_dict({k: v.double() for k, v in state.items()})
    with torch.no_grad():
        logits = model(ids).logits[:, prompt_len - 1:-1] / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


class SyncAfterFirstSegment:
    """Test wrapper around the real engine: when the first segment returns, it starts a weight sync to `new` in
    another thread and waits until the gate is closed, so every later segment runs on the new weights."""

    def __init__(self, engine: TorchRolloutEngine, new: dict) -> None:
        self.engine, self.new = engine, new
        self.producer: ContinuousRollout = None
        self.thread = None

    async def generate_tokens(self, prompt_ids, sampling):
        out = await self.engine.generate_tokens(prompt_ids, sampling)
        if self.thread is None:
            load = lambda: self.engine.load_weights(self.new.items())  # noqa: E731
            self.thread = threading.Thread(target=self.producer.sync, args=(load, 1, True))
            self.thread.start()
            while self.producer.gate._open:
                time.sleep(0.001)
        return out


@pytest.mark.timeout(120)
def test_stale_sample_is_corrected_against_the_version_of_each_token():
    v0, v1, trainer = weights(1), weights(2), weights(3)
    engine = TorchRolloutEngine(CFG, eos_token_ids=[1], pad_token_id=0)
    wrapped = SyncAfterFirstSegment(engine, v1)
    producer = ContinuousRollout(wrapped, None, response_length=RESPONSE, pad_token_id=0, segment_tokens=SEGMENT,
                                 max_stale_syncs=None, sync_timeout_s=60)
    wrapped.producer = producer
    producer.sync(lambda: engine.load_weights(v0.items()), 0, True)
    prompts = torch.randint(2, 64, (3, 5), generator=torch.Generator().manual_seed(0))
    batch = DataProto.from_dict({"input_ids": prompts, "attention_mask": torch.ones_like(prompts),
                                 "position_ids": torch.arange(5).expand(3, 5).clone()})
    producer.submit(batch, SamplingParams(n=N, temperature=TEMPERATURE, max_tokens=RESPONSE, ignore_eos=True, seed=7))
    groups: list = []
    deadline = time.time() + 60
    while len(groups) < 3 and time.time() < deadline:
        groups += producer.take(wait_s=0.5)
    producer.stop()
    wrapped.thread.join(10)
    out = DataProto.concat(groups)
    versions = out.batch[VERSIONS_KEY]
    # the first segment ran on version 0, every later one on version 1: each sample holds two token ranges
    assert versions.tolist() == [[0] * SEGMENT + [1] * (RESPONSE - SEGMENT)] * (3 * N)
    ids = out.batch["input_ids"]
    by_version = {v: reference_log_probs(s, ids, 5) for v, s in ((0, v0), (1, v1))}
    expected = torch.where(versions == 0, by_version[0], by_version[1])
    recorded = out.batch["rollout_log_probs"].double()
    torch.testing.assert_close(recorded, expected, atol=2e-5, rtol=1e-5)
    # the trainer's token TIS weights: min(exp(log pi_old - log pi_version(token)), 2) token by token
    old = reference_log_probs(trainer, ids, 5)
    mask = out.batch["response_mask"].double()
    got = rollout_correction(old, recorded, mask, RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0))
    want = [[min(math.exp(o - e), 2.0) for o, e in zip(orow, erow)] for orow, erow in zip(old.tolist(),
                                                                                        expected.tolist())]
    torch.testing.assert_close(got.weights, torch.tensor(want, dtype=torch.float64), atol=1e-4, rtol=1e-4)
    single = [[min(math.exp(o - e), 2.0) for o, e in zip(orow, erow)] for orow, erow in zip(old.tolist(),
                                                                                          by_version[0].tolist())]
    assert not torch.allclose(got.weights, torch.tensor(single, dtype=torch.float64), atol=1e-3)


def group(versions: list[int], uid: str) -> DataProto:
    v = torch.tensor([versions, versions])
    return DataProto.from_dict({VERSIONS_KEY: v, "response_mask": (v >= 0).long()},
                               {"uid": __import__("numpy").array([uid, uid], dtype=object)})


def test_queue_takes_within_the_staleness_bound_and_spills_what_is_left(tmp_path):
    q = SampleQueue(capacity=8)
    for i, vs in enumerate([[0, 0, -1], [1, 2, 2], [3, 3, 3], [-1, -1, -1]]):
        q.put(group(vs, f"g{i}"))
    assert version_span(q._groups[1]) == (1, 2)
    taken, dropped = q.take(2, trainer_version=3, max_lag=2)  # g0's oldest token is 3 updates old: dropped
    assert len(dropped) == 1 and [g.non_tensor_batch["uid"][0] for g in taken] == ["g1", "g2"]
    m = staleness_metrics(DataProto.concat(taken), trainer_version=3, sync_every=1)
    assert m["fully_async/version_lag/max"] == 2.0 and m["fully_async/version_lag/min"] == 0.0
    assert m["fully_async/partial/total_partial_num"] == 2.0 and m["fully_async/partial/max_partial_span"] == 1.0
    assert m["fully_async/staleness_hist/0_syncs"] == 0.5 and m["fully_async/staleness_hist/2_syncs"] == 0.5
    path = q.spill(str(tmp_path), extra=taken)
    back = load_spilled(path)
    assert [g.non_tensor_batch["uid"][0] for g in back] == ["g1", "g2", "g3"]
    assert torch.equal(back[0].batch[VERSIONS_KEY], taken[0].batch[VERSIONS_KEY])
