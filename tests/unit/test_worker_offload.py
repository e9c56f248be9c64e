"""Idle roles honour their megatron.*_offload flags: the reference's weights and the critic's state live in host
memory between their calls (what `hybridrl plan` counts), and come back for exactly the calls that need them."""
from __future__ import annotations

import pytest
import torch

from hybridrl.config import load_config, validate
from hybridrl.protocol import DataProto
from hybridrl.workers import ActorRolloutRefWorker, CriticWorker
from hybridrl.workers.common import onloaded


class Role:
    """Records moves and which state was on the device during each call."""

    def __init__(self, on_device: dict[str, bool]) -> None:
        self.on, self.log = dict(on_device), []

    def offload(self, params: bool, grads: bool, optimizer: bool) -> None:
        self._move(params, grads, optimizer, False)

    def onload(self, params: bool, grads: bool, optimizer: bool) -> None:
        self._move(params, grads, optimizer, True)

    def _move(self, params: bool, grads: bool, optimizer: bool, to_device: bool) -> None:
        for kind, wanted in (("params", params), ("grads", grads), ("optimizer", optimizer)):
            if wanted:
                assert self.on[kind] != to_device, f"{kind} moved twice the same way"
                self.on[kind] = to_device
        self.log.append(("onload" if to_device else "offload", params, grads, optimizer))

    def _call(self, name: str, result):
        self.log.append((name, dict(self.on)))
        return result

    def compute_log_prob(self, data, calculate_entropy=False):
        return self._call("log_prob", DataProto.from_dict({"log_probs": torch.zeros(1, 1)}))

    def compute_values(self, data):
        return self._call("values", DataProto.from_dict({"values": torch.zeros(1, 1)}))

    def update_critic(self, data):
        return self._call("update", {"critic/vf_loss": 0.0})

    def save_checkpoint(self, path):
        self._call("save", None)


def run_with(*overrides: str):
    cfg = load_config(["critic.enable=true", "critic.ppo_micro_batch_size_per_gpu=8", "trainer.device=cpu", *overrides],
                      config_name="demo")
    return validate(cfg, cuda_available=lambda: False)


def test_critic_state_comes_back_only_for_its_calls():
    run = run_with("critic.megatron.param_offload=true", "critic.megatron.optimizer_offload=true")
    worker = CriticWorker.__new__(CriticWorker)
    worker.run = run
    worker.critic = Role({"params": False, "grads": True, "optimizer": False})  # as init_model leaves it
    batch = DataProto.from_dict({"x": torch.zeros(1, 1)})
    worker.compute_values(batch)
    worker.update_critic(batch)
    worker.save_checkpoint("unused")
    on = {"params": True, "grads": True, "optimizer": True}
    assert worker.critic.log == [
        ("onload", True, False, False), ("values", on | {"optimizer": False}), ("offload", True, False, False),
        ("onload", True, False, True), ("update", on), ("offload", True, False, True),
        ("onload", True, False, True), ("save", on), ("offload", True, False, True),
    ]
    assert worker.critic.on == {"params": False, "grads": True, "optimizer": False}


def test_reference_weights_come_back_for_its_log_prob_pass_only():
    run = run_with("actor_rollout_ref.ref.megatron.param_offload=true", "actor_rollout_ref.actor.use_kl_loss=true")
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.run = run
    worker.ref = Role({"params": False, "grads": False, "optimizer": False})
    out = worker.compute_ref_log_prob(DataProto.from_dict({"x": torch.zeros(1, 1)}))
    assert "ref_log_prob" in out.batch
    assert worker.ref.log == [("onload", True, False, False), ("log_prob", {"params": True, "grads": False,
                                                                             "optimizer": False}),
                              ("offload", True, False, False)]


def test_without_flags_nothing_moves_and_errors_still_offload():
    role = Role({"params": True, "grads": True, "optimizer": True})
    with onloaded(role, params=False, grads=False, optimizer=False):
        pass
    assert role.log == []
    role = Role({"params": False, "grads": True, "optimizer": True})
    with pytest.raises(RuntimeError, match="boom"), onloaded(role, params=True, grads=False, optimizer=False):
        raise RuntimeError("boom")
    assert role.log == [("onload", True, False, False), ("offload", True, False, False)]


def test_reference_pass_reports_its_peak_with_the_weights_onloaded(monkeypatch):
    """memory/ref_peak_bytes (what the plan's ref_log_prob phase is compared with) spans the onload: the peak
    window opens before the weights come back and closes after they leave."""
    import contextlib

    import hybridrl.workers.actor_rollout_ref as arr

    run = run_with("actor_rollout_ref.ref.megatron.param_offload=true", "actor_rollout_ref.actor.use_kl_loss=true")
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.run = run
    worker.ref = Role({"params": False, "grads": False, "optimizer": False})

    @contextlib.contextmanager
    def fake_peak():  # as on a GPU: the window records what the role did inside it
        out = {}
        worker.ref.log.append("peak window opens")
        yield out
        worker.ref.log.append("peak window closes")
        out["bytes"] = 123

    monkeypatch.setattr(arr, "train_peak_memory", fake_peak)
    out = worker.compute_ref_log_prob(DataProto.from_dict({"x": torch.zeros(1, 1)}))
    assert out.meta_info["metrics"] == {"memory/ref_peak_bytes": 123.0}
    assert worker.ref.log[0] == "peak window opens" and worker.ref.log[-1] == "peak window closes"
    assert [e[0] for e in worker.ref.log[1:-1]] == ["onload", "log_prob", "offload"]


def test_the_actor_keeps_the_plans_activations_free_for_an_overlapped_onload():
    """With optimizer_offload on a GPU the hybrid worker hands the actor the plan's onload reserve (its update's
    activations and margin, hybridrl.plan); on CPU, or without optimizer_offload, none (the state comes back after
    the backward)."""
    import types

    from transformers import Qwen2Config

    from hybridrl.plan.estimate import actor_onload_reserve
    from hybridrl.plan.model_shape import from_hf_config

    hf = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
    on_gpu = ["actor_rollout_ref.actor.use_dynamic_bsz=true"]
    cfg = load_config([*on_gpu, "actor_rollout_ref.actor.megatron.optimizer_offload=true"], config_name="grpo_trainer")
    gpu = validate(cfg, cuda_available=lambda: True)
    assert gpu.derived.device == "cuda"
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.run, worker.actor = gpu, types.SimpleNamespace(hf_config=hf)
    reserve = worker._onload_reserve()
    assert reserve == actor_onload_reserve(gpu, from_hf_config(hf.to_dict())) and reserve > 2 * 2**30
    worker.run = run_with("actor_rollout_ref.actor.megatron.optimizer_offload=false")
    assert worker._onload_reserve() is None
    kept = load_config([*on_gpu, "actor_rollout_ref.actor.megatron.optimizer_offload=false"], config_name="grpo_trainer")
    worker.run = validate(kept, cuda_available=lambda: True)
    assert worker._onload_reserve() is None
    serial = load_config([*on_gpu, "actor_rollout_ref.actor.megatron.optimizer_offload=true",
                          "actor_rollout_ref.actor.megatron.optimizer_onload_overlap=false"], config_name="grpo_trainer")
    worker.run = validate(serial, cuda_available=lambda: True)
    assert worker._onload_reserve() is None


def test_the_update_hands_the_optimizer_state_to_the_weight_sync_after_its_step():
    """update_actor -> WeightSync.after_update: with optimizer_offload the state starts for the host beside what
    follows the update (hybridrl/hybrid/weight_sync.py); a split placement has no sync and nothing begins."""
    import types

    log = []
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.actor = types.SimpleNamespace(update_policy=lambda data: log.append("update") or {"actor/pg_loss": 0.0})
    worker.sync = types.SimpleNamespace(after_update=lambda: log.append("after_update"))
    out = worker.update_actor(None)
    assert log == ["update", "after_update"] and "timing_s/update_actor_worker" in out.meta_info["metrics"]
    worker.sync, log[:] = None, []
    worker.update_actor(None)
    assert log == ["update"]
