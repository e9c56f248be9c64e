"""The direct weight copy (hybridrl.hybrid.direct): Megatron-layout shards -> engine weights.

References are written here, independently of the code under test: the HF tensors themselves for the
torch engine, and vLLM's tp-sharded, fused layout built by hand (torch.cat of each rank's rows) for
the vLLM view planner. Shards come from the mapping's import (hf_to_shard), regions from its
shard_regions, as the Megatron adapter builds them.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from transformers import Qwen2Config, Qwen2MoeConfig

from hybridrl.adapters.base import WeightRegion
from hybridrl.adapters.megatron.hf_config import arch_from_hf
from hybridrl.adapters.megatron.mapping import Topology, hf_to_shard, plan, shard_regions, shards_to_hf
from hybridrl.hybrid import SyncOptions, WeightSync, WeightSyncError
from hybridrl.hybrid.direct import GraphLayouts
from hybridrl.rollout.torch_engine import TorchRolloutEngine
from hybridrl.rollout.vllm_weights import _weight_views
from tests.fixtures.actor_stubs import StubActor

CFG = Qwen2Config(vocab_size=1100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
                  use_sliding_window=False, eos_token_id=1, pad_token_id=0)


def random_hf(arch) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g) for e in plan(arch, Topology(tp=1, pp=1))
            for n, s in zip(e.hf, e.hf_shapes) if e.export}


def read_from(hf):
    def read(name, rows=None, cols=None):
        t = hf[name]
        t = t[rows] if rows is not None else t
        return t[:, cols] if cols is not None else t
    return read


class ShardActor(StubActor):
    """One tp rank's Megatron-layout shards (built with the mapping's import), exported and regioned
    the way adapters/megatron does; `step()` changes them in place like an optimizer step. With `ep` > 1 (tp 1) the
    rank holds the routed experts of its ep rank `rank` only (`grouped`: named as TE's grouped GEMM experts)."""

    def __init__(self, arch, hf, tp=1, rank=0, ep=1, grouped=False):
        assert tp == 1 or ep == 1, "tp and ep together: not needed here"
        self.arch, self.tp, self.rank = arch, tp, rank
        self.topo = Topology(tp=tp, pp=1, ep=ep, grouped_experts=grouped)
        self.entries = [e for e in plan(arch, self.topo) if e.export and e.ep_rank in (None, rank if ep > 1 else 0)]
        self.shards = {e.mcore: hf_to_shard(e, read_from(hf), arch, rank % self.topo.split(e),
                                            self.topo.split(e)).clone() for e in self.entries}
        self.exported: list[list[str]] = []

    def hf(self) -> dict[str, torch.Tensor]:
        assert self.tp == 1
        return {n: t.clone() for e in self.entries for n, t in shards_to_hf(e, [self.shards[e.mcore]], self.arch)}

    def step(self, seed):
        g = torch.Generator().manual_seed(seed)
        for t in self.shards.values():
            t.add_(torch.randn(t.shape, generator=g))

    def export_weights(self, bucket_bytes, names=None):
        bucket = [(n, t.clone()) for e in self.entries for n, t in shards_to_hf(e, [self.shards[e.mcore]], self.arch)
                  if names is None or n in names]
        self.exported.append([n for n, _ in bucket])
        if bucket:
            yield bucket

    def weight_regions(self):
        out = []
        for e in self.entries:
            extents = dict(zip(e.hf, e.hf_shapes))
            split = self.topo.split(e)
            for r in shard_regions(e, self.shards[e.mcore], self.arch, self.rank % split, split):
                out.append(WeightRegion(r.hf, r.dim, r.start, r.stop, extents[r.hf][r.dim], r.view))
        return out



def engine_equals(engine, hf) -> list[str]:
    weights = engine.named_weights()
    return [n for n, t in hf.items() if not torch.equal(weights[n], t)]


def test_after_the_proof_every_weight_is_copied_directly_and_equals_the_hf_tensors(caplog):
    arch = arch_from_hf(CFG)
    actor = ShardActor(arch, random_hf(arch))
    engine = TorchRolloutEngine(CFG)
    sync = WeightSync(actor, engine, SyncOptions())
    with caplog.at_level(logging.INFO, logger="hybridrl"):
        first = sync.push(0)
    sync.release()
    mib = sum(t.numel() * 4 for t in actor.hf().values()) / 2**20
    assert f"({mib:.1f} MiB per rank copied in place" in caplog.text and mib >= 0.1  # a tiny model's size shows
    assert first["reshard/direct_bytes"] == 0 and len(actor.exported[0]) == len(actor.hf())  # proof sync: buckets
    assert engine_equals(engine, actor.hf()) == []
    for step in (1, 2):
        actor.step(step)
        m = sync.push(step)
        sync.release()
        assert len(actor.exported) == 1 and m["reshard/buckets"] == 0  # the export is not even asked any more
        assert m["reshard/direct_bytes"] == m["reshard/bytes"] == sum(t.numel() * 4 for t in actor.hf().values())
        assert m["sync_check/direct_checked"] == len(actor.hf())
        assert engine_equals(engine, actor.hf()) == []  # bitwise, after the update


def test_direct_copy_off_streams_every_sync():
    arch = arch_from_hf(CFG)
    actor = ShardActor(arch, random_hf(arch))
    sync = WeightSync(actor, TorchRolloutEngine(CFG), SyncOptions(direct=False))
    for step in range(2):
        m = sync.push(step)
        sync.release()
        assert m["reshard/direct_bytes"] == 0 and len(actor.exported[-1]) == len(actor.hf())


def test_graph_layouts_capture_the_first_layout_and_those_that_come_back():
    """Param offload re-allocates the actor's storages: a layout seen for the first time is copied eagerly (a capture
    costs several copies), one that comes back is captured, a captured one replays, at most `limit` are kept."""
    layouts = GraphLayouts(limit=3)
    keys = ["A", "A", "B", "A", "B", "C", "D", "C", "D", "E", "C", "B"]
    want = ["capture", "replay", "eager", "replay", "capture", "eager", "eager", "capture", "eager", "eager",
            "replay", "replay"]
    assert [layouts.choose((k,)) for k in keys] == want


def test_the_direct_copy_runs_eagerly_on_cpu_and_says_so():
    arch = arch_from_hf(CFG)
    actor = ShardActor(arch, random_hf(arch))
    sync = WeightSync(actor, TorchRolloutEngine(CFG), SyncOptions())
    for step in range(2):
        m = sync.push(step)
        sync.release()
    assert sync._direct.last == "eager" and m["reshard/direct_graph"] == m["reshard/direct_captured"] == 0.0


class SwappedNormsEngine(TorchRolloutEngine):
    """A planner bug: layer 0's two norms swap views (same shape, so only the values can tell)."""

    def weight_views(self, regions):
        views = super().weight_views(regions)
        names = [r.name for r in regions]
        a, b = (names.index(f"model.layers.0.{n}.weight") for n in ("input_layernorm", "post_attention_layernorm"))
        views[a], views[b] = views[b], views[a]
        return views


def test_a_wrong_view_fails_the_proof_and_that_weight_keeps_streaming():
    arch = arch_from_hf(CFG)
    actor = ShardActor(arch, random_hf(arch))
    engine = SwappedNormsEngine(CFG)
    sync = WeightSync(actor, engine, SyncOptions())
    sync.push(0)
    sync.release()
    actor.step(1)
    sync.push(1)
    sync.release()
    assert sorted(actor.exported[-1]) == ["model.layers.0.input_layernorm.weight",
                                         "model.layers.0.post_attention_layernorm.weight"]
    assert engine_equals(engine, actor.hf()) == []


def test_a_copy_that_did_not_land_is_named_by_the_check(monkeypatch):
    arch = arch_from_hf(CFG)
    actor = ShardActor(arch, random_hf(arch))
    sync = WeightSync(actor, TorchRolloutEngine(CFG), SyncOptions())
    sync.push(0)
    sync.release()
    actor.step(1)
    direct = sync._direct

    def copy_but_the_strided():  # the qkv pieces of several query groups silently not copied
        for p in direct.pairs:
            if p.src.is_contiguous():
                p.dst.copy_(p.src)

    monkeypatch.setattr(direct, "_copy", copy_but_the_strided)
    with pytest.raises(WeightSyncError, match=r"direct copy of 'model\.layers\.0\.self_attn\.q_proj\.weight'"):
        sync.push(1)


# ------------------------------------------------------------------------------------------ vLLM layout
def vllm_params(hf, arch, tp, rank, *, tagged_embedding: bool):
    """What vLLM's loaders hold on tp rank `rank`: fused qkv/gate_up of each member's rank block, row-parallel
    column blocks, vocab rows padded to a multiple of 64 then split. Linear weights carry both tp attributes
    (as vLLM's ModelWeightParameter does, whichever dim it shards); the embedding carries one or none."""
    linear = {"output_dim": 0, "input_dim": 1}
    def block(t, dim, parts=tp):
        return t.chunk(parts, dim=dim)[rank]

    out = {}
    vocab = -(-arch.vocab_size // 64) * 64
    emb = torch.cat([hf["model.embed_tokens.weight"], torch.zeros(vocab - arch.vocab_size, arch.hidden_size)])
    out["model.embed_tokens.weight"] = (block(emb, 0), {"output_dim": 0} if tagged_embedding else {})
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[p + "input_layernorm.weight"] = (hf[p + "input_layernorm.weight"], {})
        out[p + "post_attention_layernorm.weight"] = (hf[p + "post_attention_layernorm.weight"], {})
        for kind in ("weight", "bias"):
            out[a + f"qkv_proj.{kind}"] = (torch.cat([block(hf[a + f"{x}_proj.{kind}"], 0) for x in "qkv"]),
                                          linear if kind == "weight" else {"output_dim": 0})
        out[a + "o_proj.weight"] = (block(hf[a + "o_proj.weight"], 1), linear)
        out[p + "mlp.gate_up_proj.weight"] = (torch.cat([block(hf[p + f"mlp.{x}_proj.weight"], 0) for x in ("gate", "up")]),
                                              linear)
        out[p + "mlp.down_proj.weight"] = (block(hf[p + "mlp.down_proj.weight"], 1), linear)
    out["model.norm.weight"] = (hf["model.norm.weight"], {})
    return out


class FakeVllmModel(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self._names = {}
        for i, (name, (t, attrs)) in enumerate(params.items()):
            p = torch.nn.Parameter(torch.full_like(t, float("nan")), requires_grad=False)
            for k, v in attrs.items():
                setattr(p, k, v)
            self.register_parameter(f"p{i}", p)
            self._names[name] = f"p{i}"

    def named_parameters(self, *args, **kwargs):
        for name, attr in self._names.items():
            yield name, getattr(self, attr)


@pytest.mark.parametrize("tagged_embedding", [True, False])
@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_views_reproduce_vllms_own_layout(tp, tagged_embedding):
    arch = arch_from_hf(CFG)
    hf = random_hf(arch)
    head_dim = arch.head_dim
    fused = {"qkv_proj": (arch.num_heads * head_dim, arch.num_kv_heads * head_dim, arch.num_kv_heads * head_dim),
             "gate_up_proj": (arch.ffn_hidden_size, arch.ffn_hidden_size)}
    for rank in range(tp):
        want = vllm_params(hf, arch, tp, rank, tagged_embedding=tagged_embedding)
        model = FakeVllmModel(want)
        actor = ShardActor(arch, hf, tp=tp, rank=rank)
        regions = actor.weight_regions()
        views = _weight_views(model, regions, tp, rank, fused)
        placed = set()
        for r, v in zip(regions, views):
            if v is not None:
                v.copy_(r.src)
                placed.add(r.name)
        got = dict(model.named_parameters())
        for name, (t, _) in want.items():
            if name == "model.embed_tokens.weight":
                continue
            assert torch.equal(got[name], t), (tp, rank, name)  # every element, no NaN left
        # Megatron and vLLM both pad the vocabulary to a multiple of 64, so at any tp each rank holds the same
        # rows in both engines and the embedding goes direct; its padding rows are vLLM's own (written by
        # load_weights at the first sync), never by the copy
        rows = want["model.embed_tokens.weight"][0].shape[0]
        real = min(rows, arch.vocab_size - rank * rows)
        assert "model.embed_tokens.weight" in placed, (tp, rank)
        assert torch.equal(got["model.embed_tokens.weight"][:real], want["model.embed_tokens.weight"][0][:real])
        assert bool(got["model.embed_tokens.weight"][real:].isnan().all())
        assert len(placed) == len(hf)


def test_vllm_views_refuse_replicated_kv_heads():
    arch = dataclasses.replace(arch_from_hf(CFG), num_kv_heads=1, num_heads=4)
    region = WeightRegion("model.layers.0.self_attn.k_proj.weight", 0, 0, arch.head_dim, arch.head_dim,
                          torch.zeros(arch.head_dim, arch.hidden_size))
    p = torch.nn.Parameter(torch.zeros(3 * arch.head_dim, arch.hidden_size))
    model = FakeVllmModel({"model.layers.0.self_attn.qkv_proj.weight": (p.data, {"output_dim": 0})})
    fused = {"qkv_proj": (4 * arch.head_dim, arch.head_dim, arch.head_dim)}
    assert _weight_views(model, [region], 2, 0, fused) == [None]


# ------------------------------------------------------------------------------------------ vLLM fused experts
MOE_CFG = Qwen2MoeConfig(vocab_size=1100, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                         shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, use_sliding_window=False, eos_token_id=1, pad_token_id=0)


def vllm_moe_params(hf, arch, tp, rank, expert_parallel=False):
    """vLLM 0.26's MoE layout on tp rank `rank`, by hand: the dense pieces as above; per layer the replicated
    router and shared-expert gate, the shared expert's gate_up_proj / down_proj split like an MLP, and the routed
    experts fused under mlp.experts.routed_experts: w13 [E_local, 2 f_local, h] = [gate rows; up rows] of each
    expert's rank block and w2 [E_local, h, f_local] (tensor parallel), or whole experts, a block per rank
    (expert parallel)."""
    linear = {"output_dim": 0, "input_dim": 1}

    def block(t, dim):
        return t.chunk(tp, dim=dim)[rank]

    out = {"model.embed_tokens.weight": (block(torch.cat([hf["model.embed_tokens.weight"],
                                                          torch.zeros(1152 - 1100, 32)]), 0), {"output_dim": 0}),
           "model.norm.weight": (hf["model.norm.weight"], {}), "lm_head.weight": (block(torch.cat(
               [hf["lm_head.weight"], torch.zeros(1152 - 1100, 32)]), 0), {"output_dim": 0})}
    for i in range(arch.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[p + n + ".weight"] = (hf[p + n + ".weight"], {})
        for kind in ("weight", "bias"):
            out[a + f"qkv_proj.{kind}"] = (torch.cat([block(hf[a + f"{x}_proj.{kind}"], 0) for x in "qkv"]), linear)
        out[a + "o_proj.weight"] = (block(hf[a + "o_proj.weight"], 1), linear)
        m = p + "mlp."
        out[m + "gate.weight"] = (hf[m + "gate.weight"], {})
        out[m + "shared_expert_gate.weight"] = (hf[m + "shared_expert_gate.weight"], {})
        out[m + "shared_expert.gate_up_proj.weight"] = (torch.cat([block(hf[m + f"shared_expert.{x}_proj.weight"], 0)
                                                                   for x in ("gate", "up")]), linear)
        out[m + "shared_expert.down_proj.weight"] = (block(hf[m + "shared_expert.down_proj.weight"], 1), linear)
        experts = range(arch.num_experts)
        if expert_parallel:
            per = arch.num_experts // tp
            experts = range(rank * per, (rank + 1) * per)
        cut = (lambda t, dim: t) if expert_parallel else block
        w13 = [torch.cat([cut(hf[m + f"experts.{e}.{x}_proj.weight"], 0) for x in ("gate", "up")]) for e in experts]
        w2 = [cut(hf[m + f"experts.{e}.down_proj.weight"], 1) for e in experts]
        out[m + "experts.routed_experts.w13_weight"] = (torch.stack(w13), {})
        out[m + "experts.routed_experts.w2_weight"] = (torch.stack(w2), {})
    return out


@pytest.mark.parametrize("tp, expert_parallel", [(1, False), (2, False), (2, True)])
def test_vllm_views_place_routed_and_shared_experts_in_vllms_fused_layout(tp, expert_parallel):
    arch = arch_from_hf(MOE_CFG)
    hf = random_hf(arch)
    fused = {"qkv_proj": (arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim,
                          arch.num_kv_heads * arch.head_dim)}
    for rank in range(tp):
        want = vllm_moe_params(hf, arch, tp, rank, expert_parallel)
        model = FakeVllmModel(want)
        regions = ShardActor(arch, hf, tp=tp, rank=rank).weight_regions()
        views = _weight_views(model, regions, tp, rank, fused, experts=arch.num_experts)
        placed = {r.name for r, v in zip(regions, views) if v is not None and v.copy_(r.src) is not None}
        got = dict(model.named_parameters())
        expert_params = [n for n in want if ".experts." in n]
        if expert_parallel:  # the actor splits every expert over tp; vLLM holds whole ones: nothing to place
            assert not any(".experts." in n for n in placed)
            assert all(bool(got[n].isnan().all()) for n in expert_params)
            continue
        for name, (t, _) in want.items():
            if "embed_tokens" not in name and "lm_head" not in name:
                assert torch.equal(got[name], t), (tp, rank, name)  # every element, no NaN left
        assert {n for n in hf if ".experts." in n} <= placed


def test_vllm_checksums_of_fused_experts_add_up_every_expert_of_the_layer():
    from hybridrl.rollout.vllm_engine import VLLMRolloutEngine
    from hybridrl.rollout.vllm_weights import _local_sums

    arch = arch_from_hf(MOE_CFG)
    hf = random_hf(arch)
    model = FakeVllmModel(vllm_moe_params(hf, arch, 1, 0))
    for name, (t, _) in vllm_moe_params(hf, arch, 1, 0).items():
        dict(model.named_parameters())[name].data.copy_(t)
    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)
    engine._num_experts, engine._kv_replicas = arch.num_experts, 1.0
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    terms = engine.checksum_terms(name)
    assert len(terms) == 2 * arch.num_experts and all(c == 1.0 for _, c in terms)
    assert terms[0][0] == "model.layers.1.mlp.experts.0.gate_proj.weight"  # the group every member samples by
    want = sum(float(hf[n].double().sum()) for n, _ in terms)
    got = _local_sums(model, [name, "model.layers.1.mlp.experts.3.down_proj.weight"], 1)
    assert got[name] == pytest.approx(want, rel=1e-12)
    downs = sum(float(hf[f"model.layers.1.mlp.experts.{e}.down_proj.weight"].double().sum()) for e in range(4))
    assert got["model.layers.1.mlp.experts.3.down_proj.weight"] == pytest.approx(downs, rel=1e-12)
