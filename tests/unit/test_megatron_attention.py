"""The SDPA core attention of the local layer spec against attention written out in float64 here.

Shapes follow megatron's convention: query [s, b, heads, d], key/value [s, b, kv_groups, d], output
[s, b, heads * d]. The end-to-end checks (whole models vs transformers, in tp/pp layouts) are in
tests/dist/test_megatron_layouts.py; this file pins the kernel itself and which cases it hands back to
megatron's DotProductAttention.
"""
from __future__ import annotations

import itertools
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


# ------------------------------------------------------------------------------------------ packed (THD)
def _packed(lengths, starts=None, heads=4, groups=2, d=8, seed=3):
    """q [T, heads, d], k/v [T, groups, d] and PackedSeqParams for sequences of `lengths` at `starts`."""
    from megatron.core.packed_seq_params import PackedSeqParams

    starts = starts or [sum(lengths[:i]) for i in range(len(lengths))]
    T = starts[-1] + lengths[-1] + 2  # two trailing tokens that belong to no sequence
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, n, d, generator=g) for n in (heads, groups, groups))
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    padded = torch.tensor(starts + [T], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                             cu_seqlens_kv_padded=padded, max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
    return q, k, v, params, starts


@pytest.fixture
def megatron_kernel(monkeypatch):
    """DotProductAttention.forward replaced by the float64 reference (megatron's kernel needs CUDA-only pieces
    outside a worker): records the query shape of every call."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    calls = []

    def reference(self, q, k, v, mask, attn_mask_type=None, **kw):
        calls.append(tuple(q.shape))
        return _reference(q, k, v).float()

    monkeypatch.setattr(DotProductAttention, "forward", reference)
    return calls


@pytest.mark.parametrize("config", [{}, {"attention_backend": "unfused"}, {"window_size": (2, 0)}],
                         ids=["sdpa", "unfused", "sliding_window"])
def test_packed_sequences_run_one_by_one_and_attend_only_within_themselves(config, megatron_kernel):
    if "attention_backend" in config:
        config = {"attention_backend": attention.to_megatron(config["attention_backend"])}
    lengths, starts = [5, 1, 3], [0, 6, 7]  # a gap of one padding token after the first sequence
    q, k, v, params, _ = _packed(lengths, starts)
    out = _make(**config)(q, k, v, None, packed_seq_params=params)
    assert out.shape == (q.shape[0], 32)
    for n, s in zip(lengths, starts):
        one = [t[s:s + n].unsqueeze(1) for t in (q, k, v)]
        torch.testing.assert_close(out[s:s + n].double(), _reference(*one)[:, 0], atol=2e-6, rtol=0)
    assert not out[5].any() and not out[-2:].any()  # tokens outside every sequence
    sdpa = not config  # SDPA runs the plain causal case itself; megatron's kernel gets the others, per sequence
    assert megatron_kernel == ([] if sdpa else [(5, 1, 4, 8), (1, 1, 4, 8), (3, 1, 4, 8)])


def test_megatrons_thd_rope_restarts_at_every_packed_sequence():
    """megatron 0.16.1 applies RoPE per cu_seqlens segment from position 0 (as long as the rotary table is not
    exactly as long as the packed sequence, which max_seqlen_q of two or more rows never is)."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True)
    angles = torch.arange(5.0)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8)[None]  # megatron's table layout
    freqs = torch.cat([angles, angles], -1)[:, None, None, :]  # [max_s, 1, 1, d]
    q, _, _, params, _ = _packed([5, 3])
    q = q[:8]
    packed = apply_rotary_pos_emb(q, freqs, cfg, cu_seqlens=params.cu_seqlens_q, cp_group=_OneRank())
    for s, n in ((0, 5), (5, 3)):
        alone = apply_rotary_pos_emb(q[s:s + n, None], freqs[:n], cfg, cp_group=_OneRank())[:, 0]
        assert torch.equal(packed[s:s + n], alone)
