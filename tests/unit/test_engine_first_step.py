"""Engine.train_step hands the caching allocator's free blocks back before the step that creates the optimizer's
state, and only then: the lazily made Adam moments would otherwise be carved out of the forward/backward's cached
segments and pin them for the rest of the run (issue 42's H100 run: 9.3 GB held in every phase after the first update).
"""
from __future__ import annotations

import types

import torch

import hybridrl.adapters.megatron.engine as engine_mod
from hybridrl.adapters.megatron.engine import Engine, has_state


def _megatron_like(*inner: object) -> types.SimpleNamespace:
    """A ChainedOptimizer's shape: members wrapping a torch optimizer as `.optimizer` (None: a stub member)."""
    return types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(optimizer=o) for o in inner],
                                 zero_grad=lambda: None)


def test_has_state_is_false_until_the_first_step_makes_it():
    p = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.AdamW([p], lr=0.1)
    opt = _megatron_like(None, adam)
    assert not has_state(opt)
    p.grad = torch.ones(3)
    adam.step()
    assert has_state(opt)
    assert has_state(_megatron_like(None))  # a stub alone (no parameters on this rank) has nothing to make


def test_the_cache_is_emptied_before_the_first_step_only(monkeypatch):
    log: list[str] = []
    p = torch.nn.Parameter(torch.ones(2))
    adam = torch.optim.AdamW([p], lr=0.1)

    def step(optimizer, clip_grad):  # megatron's step: the state appears at the first one
        p.grad = torch.ones(2)
        adam.step()
        log.append("optimizer_step")
        return 1.0, True

    monkeypatch.setattr(engine_mod, "optimizer_step", step)
    monkeypatch.setattr(engine_mod.compat, "empty_cache", lambda: log.append("empty_cache"))
    engine = Engine.__new__(Engine)
    engine.optimizer, engine.optim, engine.optimizer_steps = _megatron_like(adam), types.SimpleNamespace(clip_grad=0), 0
    engine.chunks = [types.SimpleNamespace(zero_grad_buffer=lambda: None)]
    engine.config = types.SimpleNamespace(num_moe_experts=None)
    engine.run = lambda *a, **k: log.append("forward_backward") or []
    for _ in range(3):
        engine.train_step([], loss_fn=None)
    assert log == ["forward_backward", "empty_cache", "optimizer_step"] + ["forward_backward", "optimizer_step"] * 2
    assert engine.optimizer_steps == 3
