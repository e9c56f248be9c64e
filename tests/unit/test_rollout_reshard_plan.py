"""ReshardPlan: rank maps of both layouts, prompt chunks, the export's collectives, validation."""
import pytest
from transformers import Qwen2Config

from hybridrl.config.layout import ParallelLayout
from hybridrl.config.rollout_checks import RolloutLayout
from hybridrl.hybrid.plan import ReshardPlan


def test_megatron_rank_order_and_rollout_replicas():
    plan = ReshardPlan(world_size=8, tp=2, pp=2, dp=2, tp_g=4)
    # tp fastest, then dp, then pp (megatron-core "tp-cp-ep-dp-pp")
    coords = [(p.tp_rank, p.dp_rank, p.pp_rank) for p in map(plan.placement, range(8))]
    assert coords == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]
    assert [plan.placement(r).replica for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [plan.placement(r).tp_g_rank for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert plan.dp_g == 2 and plan.replica_ranks(1) == (4, 5, 6, 7) and plan.collect_ranks() == (0, 4)
    assert all(plan.train_rank(p.tp_rank, p.cp_rank, p.dp_rank, p.pp_rank) == r
               for r, p in ((r, plan.placement(r)) for r in range(8)))


def test_collectives_and_bytes():
    plan = ReshardPlan(world_size=8, tp=2, pp=2, dp=2, tp_g=1)
    steps = {s.kind: s.groups for s in plan.collective_steps()}
    assert steps["tp_all_gather"] == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert steps["pp_broadcast"] == ((0, 4), (1, 5), (2, 6), (3, 7))
    b = plan.bytes_per_sync(1000)
    assert b["streamed_per_rank"] == 1000 and b["received_per_rank"] == 250 + 500
    assert ReshardPlan(world_size=2, tp=1, pp=1, dp=2, tp_g=2).collective_steps() == []
    text = plan.describe(model_bytes=2**30)
    assert "replica 7: ranks [7]" in text and "pp_broadcast" in text and "1024.0 MiB" in text


@pytest.mark.parametrize("world, tp, pp, ep, etp", [(4, 1, 1, 4, 1), (8, 2, 2, 2, 1), (8, 2, 1, 4, 2), (16, 2, 2, 2, 2)])
def test_expert_parallel_groups_are_megatrons(world, tp, pp, ep, etp):
    """The export's ep all-gather groups, against megatron-core's own expert rank generator (order tp-cp-ep-dp-pp,
    etp in tp's place); an ep4 actor feeding vLLM tp_g4 is described with its ep step, not as a full copy per rank."""
    from megatron.core.parallel_state import RankGenerator

    plan = ReshardPlan(world_size=world, tp=tp, pp=pp, dp=world // (tp * pp), tp_g=1, ep=ep, etp=etp)
    edp = world // (pp * ep * etp)
    want = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp").get_ranks("ep")
    assert sorted(plan.ep_groups()) == sorted(tuple(g) for g in want)
    four = ReshardPlan(world_size=4, tp=1, pp=1, dp=4, tp_g=4, ep=4)
    text = four.describe(model_bytes=2**30)
    assert "ep_all_gather" in text and "no collectives" not in text and "the other 3 ep rank(s)" in text


def test_prompt_chunks():
    plan = ReshardPlan(world_size=4, tp=4, pp=1, dp=1, tp_g=2)
    assert plan.prompt_slice(6, 0) == slice(0, 3) and plan.prompt_slice(6, 1) == slice(3, 6)
    with pytest.raises(ValueError, match="pad_to_multiple"):
        plan.prompt_slice(5, 0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(world_size=4, tp=2, pp=1, dp=1, tp_g=1), "tp\\*pp\\*cp\\*dp"),
        (dict(world_size=4, tp=2, pp=1, dp=2, tp_g=3), "tensor_model_parallel_size"),
        (dict(world_size=4, tp=2, pp=1, dp=2, tp_g=0), "tp_g=0"),
    ],
)
def test_impossible_layouts_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReshardPlan(**kwargs)


def test_from_validated_layouts_and_head_check():
    train = ParallelLayout(world_size=4, tp=2, pp=2, cp=1, vpp=None, dp=1, sequence_parallel=False, dtype="float32")
    cfg = Qwen2Config(num_attention_heads=6, num_key_value_heads=2, hidden_size=48)
    plan = ReshardPlan.from_layouts(train, RolloutLayout("torch", 2, 2, 1), cfg)
    assert (plan.tp, plan.pp, plan.tp_g, plan.dp_g) == (2, 2, 2, 2)
    with pytest.raises(ValueError, match="6 attention heads"):
        ReshardPlan.from_layouts(train, RolloutLayout("torch", 4, 1, 1), cfg)
