"""engine.use_fused_torch_adam: megatron's torch AdamW fallback switched to fused, checked against AdamW written out
in float64, and checkpoints crossing between the foreach and fused forms (benchmarks/results/adam_mem.md: why)."""
from __future__ import annotations

import types

import torch

from hybridrl.adapters.megatron.engine import use_fused_torch_adam

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def _megatron_like(params: list[torch.Tensor], cls=torch.optim.AdamW) -> types.SimpleNamespace:
    """The shape megatron hands back: a ChainedOptimizer whose members wrap a torch optimizer as `.optimizer`."""
    inner = cls(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    return types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(optimizer=inner)])


def _adamw_float64(p: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p, m, v = p.double().clone(), torch.zeros_like(p, dtype=torch.float64), torch.zeros_like(p, dtype=torch.float64)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        p.mul_(1 - LR * WD)
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        m_hat, v_hat = m / (1 - BETAS[0] ** t), v / (1 - BETAS[1] ** t)
        p -= LR * m_hat / (v_hat.sqrt() + EPS)
    return p


def _steps(opt, params: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> None:
    inner = opt.chained_optimizers[0].optimizer
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        inner.step()


def test_fused_adamw_matches_float64_adamw():
    torch.manual_seed(0)
    params = [torch.randn(300, requires_grad=True), torch.randn(7, 5, requires_grad=True)]
    start = [p.detach().clone() for p in params]
    grads = [[torch.randn_like(p) for p in params] for _ in range(4)]
    opt = _megatron_like(params)
    assert use_fused_torch_adam(opt) == 1
    group = opt.chained_optimizers[0].optimizer.param_groups[0]
    assert group["fused"] is True and group["foreach"] is False
    _steps(opt, params, grads)
    for i, p in enumerate(params):
        want = _adamw_float64(start[i], [g[i] for g in grads])
        torch.testing.assert_close(p.detach().double(), want, rtol=0, atol=1e-5)


def test_checkpoints_cross_between_foreach_and_fused():
    torch.manual_seed(1)
    grads = [[torch.randn(64)] for _ in range(4)]
    ref = [torch.randn(64, requires_grad=True)]
    start = ref[0].detach().clone()
    plain = _megatron_like(ref)
    _steps(plain, ref, grads[:2])  # foreach: its `step` counters live on the host
    saved = plain.chained_optimizers[0].optimizer.state_dict()
    resumed_params = [ref[0].detach().clone().requires_grad_(True)]
    resumed = _megatron_like(resumed_params)
    use_fused_torch_adam(resumed)
    resumed.chained_optimizers[0].optimizer.load_state_dict(saved)
    _steps(resumed, resumed_params, grads[2:])
    want = _adamw_float64(start, [g[0] for g in grads])
    torch.testing.assert_close(resumed_params[0].detach().double(), want, rtol=0, atol=1e-5)


def test_other_optimizers_are_left_alone():
    params = [torch.randn(8, requires_grad=True)]
    sgd = types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(optimizer=torch.optim.SGD(params, lr=0.1))])
    assert use_fused_torch_adam(sgd) == 0
    assert "fused" not in sgd.chained_optimizers[0].optimizer.param_groups[0] or \
        not sgd.chained_optimizers[0].optimizer.param_groups[0]["fused"]
    adam = _megatron_like(params, cls=torch.optim.Adam)  # megatron's choice without decoupled weight decay
    assert use_fused_torch_adam(adam) == 1
    assert use_fused_torch_adam(adam) == 0  # already fused
