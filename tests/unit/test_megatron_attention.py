"""The SDPA core attention of the local layer spec against attention written out in float64 here.

Shapes follow megatron's convention: query [s, b, heads, d], key/value [s, b, kv_groups, d], output
[s, b, heads * d]. The end-to-end checks (whole models vs transformers, in tp/pp layouts) are in
tests/dist/test_megatron_layouts.py; this file pins the kernel itself and which cases it hands back to
megatron's DotProductAttention.
"""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("megatron.core")

from hybridrl.adapters.megatron import attention  # noqa: E402


class _OneRank:
    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _make(heads=4, groups=2, d=8, **config):
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = {"attention_dropout": 0.0, **config}
    cfg = TransformerConfig(num_layers=1, hidden_size=heads * d, num_attention_heads=heads, num_query_groups=groups,
                            kv_channels=d, use_cpu_initialization=True, **config)
    pgs = ProcessGroupCollection()
    pgs.tp = _OneRank()
    return attention.sdpa_attention_class()(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                            attention_type="self", pg_collection=pgs)


def _reference(q, k, v):
    """Causal softmax attention with grouped kv heads, float64, one loop per head."""
    s, b, heads, d = q.shape
    groups = k.shape[2]
    out = torch.zeros(s, b, heads, d, dtype=torch.float64)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for h in range(heads):
        g = h // (heads // groups)  # query heads h0..h0+r-1 share kv group g (megatron/HF order)
        for i in range(b):
            scores = q[:, i, h].double() @ k[:, i, g].double().T / math.sqrt(d)
            scores = scores.masked_fill(~causal, float("-inf"))
            out[:, i, h] = scores.softmax(-1) @ v[:, i, g].double()
    return out.reshape(s, b, heads * d)


def _qkv(s=7, b=3, heads=4, groups=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, heads, d, generator=g)
    k = torch.randn(s, b, groups, d, generator=g)
    v = torch.randn(s, b, groups, d, generator=g)
    return q, k, v


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (6, 1)])
def test_sdpa_matches_float64_causal_attention_with_grouped_kv(heads, groups):
    attn = _make(heads=heads, groups=groups)
    q, k, v = _qkv(heads=heads, groups=groups)
    out = attn(q, k, v, None)
    assert out.shape == (7, 3, heads * 8)
    torch.testing.assert_close(out.double(), _reference(q, k, v), atol=2e-6, rtol=0)


def test_sdpa_gradients_match_float64_reference():
    attn = _make()
    q, k, v = (t.requires_grad_() for t in _qkv())
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    w = torch.randn(7, 3, 32, generator=torch.Generator().manual_seed(1))
    (attn(q, k, v, None) * w).sum().backward()
    (_reference(q64, k64, v64) * w.double()).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_a_future_token_does_not_change_earlier_outputs():
    attn = _make()
    q, k, v = _qkv()
    k2, v2 = k.clone(), v.clone()
    k2[-1] += 5.0
    v2[-1] -= 3.0
    a, b = attn(q, k, v, None), attn(q, k2, v2, None)
    assert torch.equal(a[:-1], b[:-1])
    assert not torch.allclose(a[-1], b[-1])


def test_cases_sdpa_cannot_express_go_to_megatrons_attention(monkeypatch):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    calls = []
    monkeypatch.setattr(DotProductAttention, "forward", lambda self, *a, **kw: calls.append(kw) or "megatron")
    q, k, v = _qkv()
    assert _make()(q, k, v, torch.ones(1, 1, 7, 7, dtype=torch.bool)) == "megatron"  # explicit mask
    assert _make(window_size=(3, 0))(q, k, v, None) == "megatron"  # sliding window
    dropout = _make(attention_dropout=0.1)
    assert dropout.train()(q, k, v, None) == "megatron"  # dropout while training ...
    assert isinstance(dropout.eval()(q, k, v, None), torch.Tensor)  # ... but not in eval
    assert len(calls) == 3


@pytest.mark.parametrize("value,sdpa", [(None, True), ("auto", True), ("flash", True), ("fused", True),
                                        ("unfused", False), ("local", False)])
def test_attention_backend_selects_the_kernel(value, sdpa):
    from types import SimpleNamespace

    assert attention.uses_sdpa(SimpleNamespace(attention_backend=value)) is sdpa
    if value is not None:
        assert attention.uses_sdpa(SimpleNamespace(attention_backend=attention.to_megatron(value))) is sdpa
