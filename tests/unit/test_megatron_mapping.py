"""The HF <-> Megatron weight mapping as pure tensor functions (no processes; megatron only for its spec renames):
fused QKV per query group, fused gate/up, vocab padding, row/column splits, pipeline ownership, and
the HF-config checks that name the field or knob to change."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridrl.adapters.megatron.hf_config import (
    ModelArch,
    RopeSpec,
    UnsupportedModelError,
    arch_from_hf,
    check_layout,
)
from hybridrl.adapters.megatron.mapping import Topology, hf_to_shard, layer_owner, plan, shard_shape, shards_to_hf

ARCH = ModelArch(model_type="qwen2", vocab_size=1001, hidden_size=16, ffn_hidden_size=24, num_layers=4, num_heads=4,
                 num_kv_heads=2, head_dim=6, norm_eps=1e-6, rope=RopeSpec(theta=1e4), max_position_embeddings=64,
                 tie_embeddings=False, qkv_bias=True, qk_norm=False)


def random_hf(arch: ModelArch, topo: Topology) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=g) for e in plan(arch, topo) for name, shape in zip(e.hf, e.hf_shapes)}


def reader(tensors):
    def read(name, rows=None, cols=None):
        t = tensors[name]
        t = t[rows] if rows is not None else t
        return t[:, cols] if cols is not None else t

    return read


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("arch", [ARCH, dataclasses.replace(ARCH, qkv_bias=False, qk_norm=True, tie_embeddings=True)])
def test_shard_then_merge_gives_back_every_hf_tensor(tp, arch):
    topo = Topology(tp=tp, pp=2)
    hf = random_hf(arch, topo)
    for entry in plan(arch, topo):
        shards = [hf_to_shard(entry, reader(hf), arch, r, tp) for r in range(tp)]
        assert all(tuple(s.shape) == shard_shape(entry, arch, tp) for s in shards), entry.mcore
        for name, tensor in shards_to_hf(entry, shards, arch):
            assert torch.equal(tensor, hf[name]), (entry.mcore, name)


@pytest.mark.parametrize("arch", [ARCH, dataclasses.replace(ARCH, qkv_bias=False, qk_norm=True)])
def test_transformer_engine_names_are_megatrons_own_renaming_of_the_local_spec(arch):
    """TE fuses the input / pre-MLP norms into linear_qkv / linear_fc1 (layer_norm_weight); megatron's local spec
    states the same correspondence for its checkpoints (sharded_state_dict_keys_map). q/k norms keep their names."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    renames = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm").submodules.sharded_state_dict_keys_map

    def te_name(local: str) -> str:
        for old, new in renames.items():
            local = local.replace(f".{old}", f".{new}")
        return local

    for topo in (Topology(tp=1, pp=1), Topology(tp=2, pp=2, vpp=2)):
        local = plan(arch, topo)
        te = plan(arch, dataclasses.replace(topo, te_names=True))
        assert [te_name(e.mcore) for e in local] == [e.mcore for e in te]
        assert [dataclasses.replace(e, mcore="") for e in local] == [dataclasses.replace(e, mcore="") for e in te]
        names = {e.mcore for e in te}
        assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in names
        assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in names
        assert not any("input_layernorm" in n or "pre_mlp_layernorm" in n for n in names)
        assert arch.qk_norm == ("decoder.layers.0.self_attention.q_layernorm.weight" in names)


def test_te_named_shards_round_trip_bitwise_and_are_detected_from_the_model():
    from hybridrl.adapters.megatron.weights import topology
    from hybridrl.config.layout import ParallelLayout

    arch = dataclasses.replace(ARCH, qk_norm=True)
    topo = Topology(tp=2, pp=1, te_names=True)
    hf = random_hf(arch, topo)
    state = {}
    for entry in plan(arch, topo):
        shards = [hf_to_shard(entry, reader(hf), arch, r, 2) for r in range(2)]
        state[entry.mcore] = shards[0]
        assert all(torch.equal(t, hf[n]) for n, t in shards_to_hf(entry, shards, arch)), entry.mcore
    layout = ParallelLayout(world_size=2, tp=2, pp=1, cp=1, vpp=None, dp=1, sequence_parallel=False, dtype="float32")
    assert topology([_module_with(state)], layout, value_head=False).te_names
    local = {e.mcore: torch.zeros(1) for e in plan(arch, Topology(tp=2, pp=1))}
    assert not topology([_module_with(local)], layout, value_head=False).te_names


def _module_with(params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module tree whose named_parameters() are exactly `params` (dotted names), like a GPTModel chunk."""
    root = torch.nn.Module()
    for name, tensor in params.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, torch.nn.Parameter(tensor.clone()))
    return root


def test_qkv_is_interleaved_per_query_group():
    arch, tp = ARCH, 2
    hf = random_hf(arch, Topology(tp=tp, pp=1))
    entry = next(e for e in plan(arch, Topology(tp=tp, pp=1)) if e.mcore.endswith("0.self_attention.linear_qkv.weight"))
    d, p = arch.head_dim, arch.heads_per_group
    q, k, v = (hf[n] for n in entry.hf)
    shard1 = hf_to_shard(entry, reader(hf), arch, 1, tp)  # rank 1 holds query group 1
    assert torch.equal(shard1[: p * d], q[p * d: 2 * p * d])  # its 2 query heads
    assert torch.equal(shard1[p * d: p * d + d], k[d: 2 * d])  # then its key head
    assert torch.equal(shard1[p * d + d:], v[d: 2 * d])  # then its value head


def test_fc1_rank_holds_its_gate_rows_then_its_up_rows():
    hf = random_hf(ARCH, Topology(tp=2, pp=1))
    entry = next(e for e in plan(ARCH, Topology(tp=2, pp=1)) if e.mcore.endswith("0.mlp.linear_fc1.weight"))
    gate, up = hf[entry.hf[0]], hf[entry.hf[1]]
    shard0 = hf_to_shard(entry, reader(hf), ARCH, 0, 2)
    assert torch.equal(shard0, torch.cat([gate[:12], up[:12]]))


def test_vocab_is_padded_with_zero_rows_and_stripped_on_export():
    hf = random_hf(ARCH, Topology(tp=2, pp=1))
    entry = plan(ARCH, Topology(tp=2, pp=1))[0]
    shards = [hf_to_shard(entry, reader(hf), ARCH, r, 2) for r in range(2)]
    assert ARCH.padded_vocab(2) == 1024 and shards[1].shape == (512, 16)
    assert torch.count_nonzero(shards[1][1001 - 512:]) == 0
    assert shards_to_hf(entry, shards, ARCH)[0][1].shape == (1001, 16)


def test_padded_vocab_does_not_depend_on_power_of_two_tp():
    arch = dataclasses.replace(ARCH, vocab_size=151_000)
    assert {arch.padded_vocab(tp) for tp in (1, 2, 4, 8)} == {151_040}  # 64 * 2360


def test_layers_follow_megatrons_interleaved_pipeline_assignment():
    arch = dataclasses.replace(ARCH, num_layers=8)
    topo = Topology(tp=1, pp=2, vpp=2)
    # chunk c = layer // 2 -> (pp rank c % 2, vp stage c // 2)
    assert [layer_owner(g, arch, topo) for g in range(8)] == [
        (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]
    entries = plan(arch, topo)
    assert entries[0].pp_rank == 0 and entries[-1].pp_rank == 1 and entries[-1].vp_stage == 1


def test_tied_embeddings_on_two_stages_import_but_do_not_export_the_copy():
    arch = dataclasses.replace(ARCH, tie_embeddings=True)
    out = [e for e in plan(arch, Topology(tp=1, pp=2)) if e.mcore == "output_layer.weight"]
    assert len(out) == 1 and not out[0].export and out[0].hf == ("model.embed_tokens.weight",)
    assert not [e for e in plan(arch, Topology(tp=1, pp=1)) if e.mcore == "output_layer.weight"]


def test_critic_maps_the_value_head_to_score():
    entries = plan(ARCH, Topology(tp=2, pp=1, value_head=True))
    head = entries[-1]
    assert head.hf == ("score.weight",) and head.optional and head.kind == "replicated"
    assert not any("lm_head" in n for e in entries for n in e.hf)


# ------------------------------------------------------------------------------------------ HF config checks
def hf_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2)
    return LlamaConfig(**{**base, **kw})


def test_llama3_rope_scaling_is_read_from_rope_parameters():
    cfg = hf_config(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                    max_position_embeddings=131072)
    rope = arch_from_hf(cfg).rope
    assert (rope.kind, rope.theta, rope.factor) == ("llama3", 5e5, 32.0)


@pytest.mark.parametrize("kw, field", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"mlp_bias": True}, "mlp_bias=True"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type='yarn'"),
])
def test_unsupported_options_name_the_hf_field(kw, field):
    with pytest.raises(UnsupportedModelError, match=field.replace("(", r"\(")):
        arch_from_hf(hf_config(**kw))


def test_layout_errors_name_the_knob():
    arch = arch_from_hf(hf_config())
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible by .*tensor_model_parallel_size=4"):
        check_layout(arch, 4, 1, None)
    with pytest.raises(ValueError, match="num_hidden_layers=4 is not divisible by .*pipeline_model_parallel_size"):
        check_layout(arch, 1, 3, None)
    check_layout(arch, 2, 2, None)


# ------------------------------------------------------------------------------------------ mixture of experts
MOE = dataclasses.replace(ARCH, model_type="qwen2_moe", num_experts=4, moe_topk=2, moe_ffn_hidden_size=10,
                          shared_expert_ffn_hidden_size=14, moe_router_pre_softmax=False, router_aux_loss_coef=0.0)


@pytest.mark.parametrize("tp, ep, etp", [(1, 2, 1), (2, 2, 2), (2, 4, 1)])
def test_experts_shard_over_ep_and_etp_and_merge_back(tp, ep, etp):
    topo = Topology(tp=tp, pp=2, ep=ep, etp=etp)
    hf = random_hf(MOE, topo)
    entries = plan(MOE, topo)
    experts = [e for e in entries if e.ep_rank is not None]
    assert len(experts) == 2 * MOE.num_experts * MOE.num_layers  # fc1 and fc2 of every expert of every layer
    for entry in entries:
        split = topo.split(entry)
        assert split == (etp if entry.ep_rank is not None else tp)
        shards = [hf_to_shard(entry, reader(hf), MOE, r, split) for r in range(split)]
        for name, tensor in shards_to_hf(entry, shards, MOE):
            assert torch.equal(tensor, hf[name]), (entry.mcore, name)


def test_expert_x_lives_on_ep_rank_x_div_experts_per_rank_as_a_local_expert():
    entries = plan(MOE, Topology(tp=1, pp=1, ep=2))
    fc1 = {e.hf[0]: e for e in entries if e.mcore.endswith("linear_fc1.weight") and e.ep_rank is not None}
    e3 = fc1["model.layers.1.mlp.experts.3.gate_proj.weight"]
    assert (e3.ep_rank, e3.mcore) == (1, "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight")
    assert e3.hf[1] == "model.layers.1.mlp.experts.3.up_proj.weight"
    grouped = [e for e in plan(MOE, Topology(tp=1, pp=1, ep=2, grouped_experts=True)) if e.hf == e3.hf]
    assert grouped[0].mcore == "decoder.layers.1.mlp.experts.linear_fc1.weight1"  # TE grouped GEMM naming


@pytest.mark.parametrize("grouped", [True, False])
def test_grouped_gemm_experts_are_detected_from_the_model_and_round_trip(grouped):
    """TE's grouped-GEMM experts hold local expert i as linear_fc1.weight{i} / linear_fc2.weight{i} (megatron-core
    0.16.1 TEGroupedMLP.sharded_state_dict, gated fc1 = [gate; up] as SequentialMLP's); the topology is read from
    the built model's names, and both namings carry the same HF tensors."""
    from hybridrl.adapters.megatron.weights import topology
    from hybridrl.config.layout import ParallelLayout

    topo = Topology(tp=1, pp=1, ep=2, grouped_experts=grouped)
    hf = random_hf(MOE, topo)
    mine = [e for e in plan(MOE, topo) if e.ep_rank in (None, 1)]
    state = {e.mcore: hf_to_shard(e, reader(hf), MOE, 0, 1) for e in mine}
    fc1 = "decoder.layers.1.mlp.experts." + ("linear_fc1.weight1" if grouped else "local_experts.1.linear_fc1.weight")
    assert torch.equal(state[fc1], torch.cat([hf["model.layers.1.mlp.experts.3.gate_proj.weight"],
                                              hf["model.layers.1.mlp.experts.3.up_proj.weight"]]))
    layout = ParallelLayout(world_size=2, tp=1, pp=1, cp=1, vpp=None, dp=2, sequence_parallel=False, dtype="float32",
                            ep=2)
    assert topology([_module_with(state)], layout, value_head=False).grouped_experts == grouped
    for entry in mine:
        assert all(torch.equal(t, hf[n]) for n, t in shards_to_hf(entry, [state[entry.mcore]], MOE)), entry.mcore


def test_moe_layer_maps_router_shared_expert_and_its_gate():
    by_hf = {n: e for e in plan(MOE, Topology(tp=2, pp=1)) for n in e.hf}
    assert by_hf["model.layers.0.mlp.gate.weight"].mcore == "decoder.layers.0.mlp.router.weight"
    assert by_hf["model.layers.0.mlp.gate.weight"].kind == "replicated"
    assert by_hf["model.layers.0.mlp.shared_expert.up_proj.weight"].kind == "fc1"
    gate = by_hf["model.layers.0.mlp.shared_expert_gate.weight"]
    assert (gate.mcore, gate.kind, gate.hf_shapes) == ("decoder.layers.0.mlp.shared_experts.gate_weight", "replicated",
                                                       ((1, 16),))
    assert by_hf["model.layers.0.post_attention_layernorm.weight"].mcore == "decoder.layers.0.pre_mlp_layernorm.weight"
    assert not any("mlp.gate_proj" in n for n in by_hf)  # no dense MLP in an MoE layer


def test_mixtral_keeps_its_block_sparse_moe_names():
    mixtral = dataclasses.replace(MOE, model_type="mixtral", shared_expert_ffn_hidden_size=None)
    names = {n for e in plan(mixtral, Topology(tp=1, pp=1)) for n in e.hf}
    assert {"model.layers.0.block_sparse_moe.gate.weight", "model.layers.0.block_sparse_moe.experts.3.w1.weight",
            "model.layers.0.block_sparse_moe.experts.3.w3.weight", "model.layers.0.block_sparse_moe.experts.3.w2.weight"} <= names
    assert not any("shared" in n for n in names)


def moe_config(kind: str, **kw):
    import transformers

    base = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_experts_per_tok=2)
    if kind == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**{**base, "num_experts": 8, "moe_intermediate_size": 16, **kw})
    if kind == "qwen2_moe":
        return transformers.Qwen2MoeConfig(**{**base, "num_experts": 8, "moe_intermediate_size": 16,
                                              "shared_expert_intermediate_size": 24, **kw})
    return transformers.MixtralConfig(**{**base, "num_local_experts": 8, **kw})


@pytest.mark.parametrize("kind, norm, pre_softmax", [("qwen3_moe", False, True), ("qwen3_moe", True, False),
                                                     ("qwen2_moe", False, True), ("mixtral", None, False)])
def test_router_semantics_follow_the_hf_config(kind, norm, pre_softmax):
    arch = arch_from_hf(moe_config(kind, **({} if norm is None else {"norm_topk_prob": norm})))
    assert arch.is_moe and arch.num_experts == 8 and arch.moe_topk == 2
    assert arch.moe_router_pre_softmax is pre_softmax
    assert arch.moe_ffn_hidden_size == (64 if kind == "mixtral" else 16)
    assert arch.shared_expert_ffn_hidden_size == (24 if kind == "qwen2_moe" else None)
    assert arch.qk_norm == (kind == "qwen3_moe") and arch.qkv_bias == (kind == "qwen2_moe")


@pytest.mark.parametrize("kind, kw, field", [
    ("qwen3_moe", {"mlp_only_layers": [1]}, "mlp_only_layers=\\[1\\]"),
    ("qwen2_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise=0.1"),
    ("mixtral", {"num_experts_per_tok": 1}, "num_experts_per_tok=1"),
])
def test_unsupported_moe_options_name_the_hf_field(kind, kw, field):
    with pytest.raises(UnsupportedModelError, match=field):
        arch_from_hf(moe_config(kind, **kw))


def test_expert_layout_errors_name_the_knob():
    from hybridrl.adapters.megatron.hf_config import check_expert_layout

    arch = arch_from_hf(moe_config("qwen2_moe"))
    with pytest.raises(ValueError, match=r"num_experts=8 is not divisible by .*expert_model_parallel_size=3"):
        check_expert_layout(arch, 1, 3, None)
    with pytest.raises(ValueError, match=r"intermediate size 16 is not divisible by .*expert_tensor_parallel_size=3"):
        check_expert_layout(arch, 1, 1, 3)
    with pytest.raises(ValueError, match="dense model without experts"):
        check_expert_layout(arch_from_hf(hf_config()), 1, 2, None)
    check_expert_layout(arch, 2, 4, 2)


@pytest.mark.parametrize("tp", [1, 2])
def test_lora_rows_shard_and_merge_back_under_peft_names(tp):
    """mapping.lora_plan: every adapter (A [r, in], B [out, r] of each HF module) with PEFT's name; cut into tp
    shards by the same functions as the base and merged back, each tensor is whole again."""
    from hybridrl.adapters.megatron.mapping import lora_plan

    topo, rank = Topology(tp=tp, pp=2), 3
    entries = lora_plan(ARCH, topo, rank, ("q_proj", "k_proj", "o_proj", "up_proj", "down_proj"))
    assert len(entries) == ARCH.num_layers * 5 * 2
    assert entries[0].hf == ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",)
    assert entries[0].mcore == "decoder.layers.0.self_attention.linear_qkv.lora.lora_A.q_proj"
    assert [e.pp_rank for e in entries[::10]] == [0, 0, 1, 1]  # 2 layers a stage
    g = torch.Generator().manual_seed(1)
    hf = {e.hf[0]: torch.randn(e.hf_shapes[0], generator=g) for e in entries}
    for entry in entries:
        shards = [hf_to_shard(entry, reader(hf), ARCH, r, tp) for r in range(tp)]
        assert all(tuple(s.shape) == shard_shape(entry, ARCH, tp) for s in shards), entry.mcore
        (name, tensor), = shards_to_hf(entry, shards, ARCH)
        assert torch.equal(tensor, hf[name]), name


def test_grouped_gemm_goes_with_the_transformer_engine_spec_and_the_local_spec_refuses_it():
    """moe_grouped_gemm: on by default with TE layers (TEGroupedMLP), off with the local spec (SequentialMLP, whose
    names the mapping reads); asking the local spec for it fails naming the keys (megatron would build its legacy
    GroupedMLP, a layout the mapping does not know)."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    from hybridrl.adapters.megatron import moe
    from hybridrl.adapters.megatron.builder import layer_spec, transformer_config
    from hybridrl.config.layout import ParallelLayout

    arch = arch_from_hf(moe_config("qwen3_moe", norm_topk_prob=True))
    layout = ParallelLayout(world_size=1, tp=1, pp=1, cp=1, vpp=None, dp=1, sequence_parallel=False, dtype="float32")
    assert moe.transformer_kwargs(arch, layout, te=True)["moe_grouped_gemm"] is True
    config = transformer_config(arch, layout, impl="local")
    assert config.moe_grouped_gemm is False
    assert layer_spec(arch, config, "local").submodules.mlp.submodules.experts.module is SequentialMLP
    with pytest.raises(ValueError, match=r"moe_grouped_gemm=true needs transformer-engine layers .* "
                                         r"\*\.megatron\.transformer_impl=transformer_engine"):
        transformer_config(arch, layout, impl="local", overrides={"moe_grouped_gemm": True})
