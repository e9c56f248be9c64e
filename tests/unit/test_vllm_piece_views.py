"""Where other ranks' pieces land in vLLM's layout (RolloutEngine.piece_views, vllm_weights._piece_views), for the
cross-GPU copy (hybridrl.hybrid.remote), on CPU: vLLM's tp-sharded, fused parameters are built by hand in
tests/unit/test_direct_copy.py (vllm_params, vllm_moe_params); pieces come from the Megatron mapping's regions of
EVERY training tp rank, as the remote plan gathers them. Filling each PieceView with the HF slice it claims must
reproduce vLLM's own layout element for element, at tp_g below, equal to and above the training tp."""
from __future__ import annotations

import pytest
import torch

from hybridrl.adapters.megatron.hf_config import arch_from_hf
from hybridrl.hybrid.remote import _key, _piece
from hybridrl.rollout.torch_engine import TorchRolloutEngine
from hybridrl.rollout.vllm_weights import _piece_views
from tests.unit.test_direct_copy import CFG, MOE_CFG, FakeVllmModel, ShardActor, random_hf, vllm_moe_params, vllm_params


def every_rank_pieces(arch, hf, tp):
    """The distinct pieces of all training tp ranks (dp copies would repeat them; the plan keeps one)."""
    seen, out = set(), []
    for rank in range(tp):
        for r in ShardActor(arch, hf, tp=tp, rank=rank).weight_regions():
            if _key(r) not in seen:
                seen.add(_key(r))
                out.append(_piece(r))
    return out


def fill(pieces, views, hf):
    for p, pv in zip(pieces, views):
        assert pv is not None, p
        if pv.view is not None:
            pv.view.copy_(hf[p.name].narrow(p.dim, pv.lo, pv.hi - pv.lo))


@pytest.mark.parametrize("tp, tp_g", [(2, 1), (1, 2), (2, 2), (1, 1), (2, 4)])
def test_vllm_piece_views_reproduce_vllms_layout_from_any_training_tp(tp, tp_g):
    arch = arch_from_hf(CFG)
    hf = random_hf(arch)
    fused = {"qkv_proj": (arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim,
                          arch.num_kv_heads * arch.head_dim),
             "gate_up_proj": (arch.ffn_hidden_size, arch.ffn_hidden_size)}
    pieces = every_rank_pieces(arch, hf, tp)
    for rank in range(tp_g):
        want = vllm_params(hf, arch, tp_g, rank, tagged_embedding=True)
        model = FakeVllmModel(want)
        views = _piece_views(model, pieces, tp_g, rank, fused, replicated_kv=tp_g > arch.num_kv_heads)
        if tp_g > arch.num_kv_heads:  # vLLM replicates whole kv heads: not a block of rows, so qkv is refused
            assert all((v is None) == (p.name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"))
                       for p, v in zip(pieces, views))
            continue
        fill(pieces, views, hf)
        got = dict(model.named_parameters())
        for name, (t, _) in want.items():
            rows = min(t.shape[0], arch.vocab_size - rank * t.shape[0]) if "embed_tokens" in name else t.shape[0]
            assert torch.equal(got[name][:rows], t[:rows]), (tp, tp_g, rank, name)  # no NaN left, every value right
        # a piece straddling this rank's block lands only in part (e.g. a tp=1 actor's whole q_proj at tp_g=2)
        partial = [p for p, pv in zip(pieces, views) if pv.view is not None and pv.hi - pv.lo < p.stop - p.start]
        assert bool(partial) == (tp < tp_g), (tp, tp_g, rank)


def test_vllm_piece_views_refuse_a_weight_the_pieces_do_not_cover():
    arch = arch_from_hf(CFG)
    hf = random_hf(arch)
    pieces = [p for p in every_rank_pieces(arch, hf, 2) if not (p.name.endswith("o_proj.weight") and p.start == 0)]
    model = FakeVllmModel(vllm_params(hf, arch, 1, 0, tagged_embedding=True))
    views = _piece_views(model, pieces, 1, 0, {"qkv_proj": (32, 16, 16)})
    assert all((v is None) == p.name.endswith("o_proj.weight") for p, v in zip(pieces, views))


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_vllm_piece_views_place_experts_from_a_tp1_actor_at_tp_g2(expert_parallel):
    arch = arch_from_hf(MOE_CFG)
    hf = random_hf(arch)
    fused = {"qkv_proj": (arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim,
                          arch.num_kv_heads * arch.head_dim)}
    pieces = every_rank_pieces(arch, hf, 1)
    for rank in range(2):
        want = vllm_moe_params(hf, arch, 2, rank, expert_parallel)
        model = FakeVllmModel(want)
        views = _piece_views(model, pieces, 2, rank, fused, experts=arch.num_experts)
        fill(pieces, views, hf)
        got = dict(model.named_parameters())
        for name, (t, _) in want.items():
            rows = min(t.shape[0], arch.vocab_size - rank * t.shape[0]) if name.endswith(("embed_tokens.weight",
                                                                                          "lm_head.weight")) else None
            assert torch.equal(got[name][:rows], t[:rows]), (expert_parallel, rank, name)
        if expert_parallel:  # the other rank's experts: held nowhere here, so no view, but not refused either
            other = [v for p, v in zip(pieces, views) if ".experts.0." in p.name] if rank == 1 else []
            assert all(v is not None and v.view is None for v in other)


def test_torch_engine_piece_views_cover_the_full_weights():
    arch = arch_from_hf(CFG)
    hf = random_hf(arch)
    engine = TorchRolloutEngine(CFG)
    pieces = every_rank_pieces(arch, hf, 2)
    views = engine.piece_views(pieces)
    fill(pieces, views, hf)
    assert all(torch.equal(engine.named_weights()[n], t) for n, t in hf.items())
    missing_half = [p for p in pieces if not (p.name == "model.norm.weight")] + \
        [p for p in pieces if p.name.endswith("q_proj.weight")][:1]  # a duplicate piece: over-covers q_proj
    views = engine.piece_views(missing_half)
    assert all((v is None) == (p.name in ("model.layers.0.self_attn.q_proj.weight",)) for p, v in zip(missing_half, views))


# issue 38's four-GPU layout at CPU size: 8 experts and 4 KV heads, so tp_g and ep go up to 4
MOE8_CFG = type(MOE_CFG)(**{**MOE_CFG.to_dict(), "num_experts": 8, "num_key_value_heads": 4})


def ep_rank_regions(arch, hf, ep, rank, grouped=False):
    return ShardActor(arch, hf, ep=ep, rank=rank, grouped=grouped).weight_regions()


@pytest.mark.parametrize("ep, tp_g, expert_parallel, grouped", [
    (4, 4, True, True), (4, 4, True, False), (2, 2, True, False), (4, 4, False, True), (2, 4, True, False)])
def test_an_expert_parallel_actor_fills_vllms_experts_and_with_expert_parallel_from_its_own_ranks(
        ep, tp_g, expert_parallel, grouped):
    """An actor at tp 1 x ep (SequentialMLP or TE grouped-GEMM names: the same HF pieces) and a colocated vLLM at
    tp_g, rank for rank. Every element of vLLM's layout comes from some rank's pieces; with vLLM's expert parallel at
    tp_g = ep each rank's routed experts come from its own shards only (no cross-GPU bytes for experts), and the
    rest of the model (held whole by every rank at tp 1) too: the whole sync is local copies."""
    arch = arch_from_hf(MOE8_CFG)
    hf = random_hf(arch)
    fused = {"qkv_proj": (arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim,
                          arch.num_kv_heads * arch.head_dim)}
    seen, pieces = set(), []
    for r in range(ep):
        for region in ep_rank_regions(arch, hf, ep, r, grouped):
            if _key(region) not in seen:
                seen.add(_key(region))
                pieces.append(_piece(region))
    assert len(pieces) == len(hf)  # tp 1: one whole piece per HF weight, held by its ep rank or by every rank
    for rank in range(tp_g):
        want = vllm_moe_params(hf, arch, tp_g, rank, expert_parallel)
        model = FakeVllmModel(want)
        views = _piece_views(model, pieces, tp_g, rank, fused, experts=arch.num_experts)
        fill(pieces, views, hf)
        got = dict(model.named_parameters())
        for name, (t, _) in want.items():
            rows = min(t.shape[0], arch.vocab_size - rank * t.shape[0]) if name.endswith(("embed_tokens.weight",
                                                                                          "lm_head.weight")) else None
            assert torch.equal(got[name][:rows], t[:rows]), (ep, tp_g, expert_parallel, rank, name)
        own = {_key(r) for r in ep_rank_regions(arch, hf, ep, rank % ep, grouped)} if rank < ep else set()
        remote = {p.name for p, v in zip(pieces, views) if v.view is not None and v.hi > v.lo and _key(p) not in own}
        if expert_parallel and tp_g == ep:
            assert remote == set(), remote
        elif not expert_parallel:  # tensor-parallel experts: a slice of every expert, most held by other ep ranks
            per = arch.num_experts // ep
            others = {n for n in hf if ".experts." in n and ".shared_expert" not in n
                      and int(n.split(".experts.")[1].split(".")[0]) // per != rank}
            assert remote == others


@pytest.mark.parametrize("grouped", [False, True])
def test_torch_engine_piece_views_take_an_expert_parallel_actors_experts_from_their_ranks(grouped):
    """The torch engine holds every expert on every rank: an ep2 actor's pieces (either expert naming) cover it, the
    shared weights and rank 0's experts from rank 0's pieces, rank 1's experts from rank 1's, and a rank's pieces
    write nothing but their own weights."""
    arch = arch_from_hf(MOE8_CFG)
    hf = random_hf(arch)
    engine = TorchRolloutEngine(MOE8_CFG)
    before = {n: t.clone() for n, t in engine.named_weights().items()}
    mine = [_piece(r) for r in ep_rank_regions(arch, hf, 2, 0, grouped)]
    theirs = [_piece(r) for r in ep_rank_regions(arch, hf, 2, 1, grouped) if ".experts." in r.name
              and ".shared_expert" not in r.name]
    fill(mine, engine.piece_views(mine), hf)
    after = engine.named_weights()
    assert {n for n in hf if not torch.equal(after[n], before[n])} == {p.name for p in mine}
    fill(theirs, engine.piece_views(theirs), hf)
    assert all(torch.equal(engine.named_weights()[n], t) for n, t in hf.items())
    assert len(mine) + len(theirs) == len(hf)
