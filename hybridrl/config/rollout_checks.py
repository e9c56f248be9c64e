"""actor_rollout_ref.rollout.*: the rollout layout (replicas of tp_g ranks over the actor's ranks, or over the
rollout's own with a split placement), sampling values, and the multi-turn agent loop's files."""
from __future__ import annotations

from dataclasses import dataclass

from .placement import Placement
from .problems import Problems, choices
from .schema import PPOConfig

ARA = "actor_rollout_ref"


@dataclass(frozen=True)
class RolloutLayout:
    engine: str  # vllm | torch
    tp: int  # tp_g
    dp: int  # dp_g
    n: int
    ep: int = 1  # rollout.expert_parallel_size: 1, or tp_g (whole experts per rank)


def check_rollout(cfg: PPOConfig, device: str, world: int, p: Problems, placement: Placement) -> RolloutLayout:
    """`world`: the actor's ranks; a split placement's replicas live on the rollout's own ranks instead."""
    r, key = cfg.actor_rollout_ref.rollout, f"{ARA}.rollout"
    if placement.split:
        world = placement.rollout_world
    engine = r.name
    choices(f"{key}.name", engine, ["auto", "vllm", "torch", "hf"], p)
    if engine == "auto":
        engine = "vllm" if device == "cuda" else "torch"
    if engine == "hf":
        engine = "torch"
    p.check(not (engine == "vllm" and device == "cpu"),
            f"{key}.name=vllm needs a GPU; on CPU use {key}.name=torch (or auto)")
    tp_g = r.tensor_model_parallel_size
    if p.check(tp_g >= 1 and world % tp_g == 0,
               f"{key}.tensor_model_parallel_size={tp_g} must divide the {world} ranks; e.g. set it to 1"):
        dp_g = world // tp_g
    else:
        dp_g = 1
    per_node, per_node_key = ((placement.rollout_gpus_per_node, f"{key}.n_gpus_per_node") if placement.split
                              else (cfg.trainer.n_gpus_per_node, "trainer.n_gpus_per_node"))
    p.check(tp_g <= per_node, f"{key}.tensor_model_parallel_size={tp_g} is larger than {per_node_key}={per_node}: "
                              f"a {'' if placement.split else 'colocated '}rollout replica must fit in one node; "
                              f"use at most {per_node}")
    p.check(r.pipeline_model_parallel_size == 1, f"{key}.pipeline_model_parallel_size must be 1 (the rollout engine is not pipelined)")
    p.check(r.data_parallel_size in (1, dp_g),
            f"{key}.data_parallel_size={r.data_parallel_size}: the rollout replicas are world/tp_g = {dp_g}; leave it at 1")
    ep_g = r.expert_parallel_size
    p.check(ep_g in (1, tp_g), f"{key}.expert_parallel_size={ep_g} must be 1 (experts split like the other weights) or "
                               f"{key}.tensor_model_parallel_size={tp_g} (whole experts per rank: vLLM's expert "
                               "parallel inside a replica)")
    if ep_g > 1 and engine == "torch":
        p.notes.append(f"{key}.expert_parallel_size={ep_g} has no effect on the torch engine (it holds every expert)")
    p.check(r.n >= 1, f"{key}.n={r.n} must be >= 1")
    p.check(r.temperature >= 0, f"{key}.temperature={r.temperature} must be >= 0")
    p.check(0 < r.top_p <= 1, f"{key}.top_p={r.top_p} must be in (0, 1]")
    p.check(r.top_k == -1 or r.top_k > 0, f"{key}.top_k={r.top_k} must be -1 (off) or > 0")
    choices(f"{key}.kv_cache_sizing", r.kv_cache_sizing, ["remember", "profile", "plan"], p)
    p.check(0 < r.gpu_memory_utilization <= 1, f"{key}.gpu_memory_utilization={r.gpu_memory_utilization} must be in (0, 1]")
    p.check(r.update_weights_bucket_megabytes >= 1, f"{key}.update_weights_bucket_megabytes must be >= 1")
    p.check(0 < r.sync_check.sample_fraction <= 1, f"{key}.sync_check.sample_fraction must be in (0, 1]")
    p.check(r.val_kwargs.n >= 1, f"{key}.val_kwargs.n={r.val_kwargs.n} must be >= 1")
    sizes = r.cudagraph_capture_sizes
    if sizes is not None:
        p.check(bool(sizes) and all(isinstance(s, int) and s >= 1 for s in sizes),
                f"{key}.cudagraph_capture_sizes={sizes} must be a non-empty list of batch sizes >= 1 (or null)")
        p.check(not r.enforce_eager, f"{key}.cudagraph_capture_sizes is set but {key}.enforce_eager=true captures no "
                                     "graphs; remove one of them")
    total = cfg.data.max_prompt_length + cfg.data.max_response_length
    p.check(r.max_model_len is None or r.max_model_len >= total,
            f"{key}.max_model_len={r.max_model_len} is below data.max_prompt_length + data.max_response_length = {total}")
    if r.mode == "async":
        p.notes.append(f"{key}.mode=async: each replica generates its batch in one call (per-request generation "
                       f"runs with {key}.multi_turn; overlap with training: trainer.one_step_off_policy)")
    else:
        choices(f"{key}.mode", r.mode, ["sync", "async"], p)
    return RolloutLayout(engine, tp_g, dp_g, max(r.n, 1), ep=ep_g if ep_g in (1, tp_g) else 1)


# ---------------------------------------------------------------------------------------------- batches


def check_multi_turn(cfg: PPOConfig, rollout: RolloutLayout, p: Problems) -> None:
    """multi_turn.*: the tool and interaction files load (classes import, schemas parse) before any worker starts."""
    m, key = cfg.actor_rollout_ref.rollout.multi_turn, f"{ARA}.rollout.multi_turn"
    if not m.enable:
        p.check(not cfg.data.tool_config_path,
                f"data.tool_config_path={cfg.data.tool_config_path} (it follows {key}.tool_config_path unless set) "
                f"writes tool schemas into every prompt, but {key}.enable=false: no tool would answer a call. Set "
                f"{key}.enable=true, or data.tool_config_path=null")
        return
    from hybridrl.agent import TOOL_CALL_FORMATS, load_interactions, load_tools
    from hybridrl.agent.loop import TRUNCATE_SIDES

    choices(f"{key}.format", m.format, TOOL_CALL_FORMATS.names(), p)
    choices(f"{key}.tool_response_truncate_side", m.tool_response_truncate_side, list(TRUNCATE_SIDES), p)
    for name in ("max_assistant_turns", "max_user_turns"):
        v = getattr(m, name)
        p.check(v is None or v >= 1, f"{key}.{name}={v} must be null or >= 1")
    p.check(m.max_parallel_calls >= 1, f"{key}.max_parallel_calls={m.max_parallel_calls} must be >= 1")
    p.check(m.max_tool_response_length >= 1, f"{key}.max_tool_response_length must be >= 1")
    p.check(m.tool_timeout_s > 0, f"{key}.tool_timeout_s={m.tool_timeout_s} must be > 0")
    loaded = {}
    for path, loader, name in ((m.tool_config_path, load_tools, "tool_config_path"),
                               (m.interaction_config_path, load_interactions, "interaction_config_path")):
        if path is None:
            continue
        try:
            loaded[name] = loader(path)
        except Exception as e:  # the loaders' messages name the file, the entry and the class
            p.errors.append(f"{key}.{name}: {type(e).__name__}: {e}")
    if cfg.data.tool_config_path and (m.tool_config_path is None or "tool_config_path" in loaded):
        _check_prompt_tools(cfg, set(loaded.get("tool_config_path", {})), p)
    if not m.tool_config_path and not m.interaction_config_path:
        p.notes.append(f"{key}.enable=true without tool_config_path or interaction_config_path: every sample is one turn")
    # one tp_g rank would add requests at other times than its peers (tools finish when they finish), and
    # vLLM's tensor-parallel steps must see the same batch on every rank of a replica
    p.check(rollout.engine != "vllm" or rollout.tp == 1,
            f"{key}.enable=true with {ARA}.rollout.name=vllm needs {ARA}.rollout.tensor_model_parallel_size=1 "
            f"(got {rollout.tp}): per-request generation runs each replica's turn loops on one GPU")


def _check_prompt_tools(cfg: PPOConfig, callable_: set[str], p: Problems) -> None:
    """data.tool_config_path: the tools written into prompts must be among the agent loop's (`callable_`)."""
    m, key, path = cfg.actor_rollout_ref.rollout.multi_turn, f"{ARA}.rollout.multi_turn", cfg.data.tool_config_path
    if path == m.tool_config_path:
        return
    from hybridrl.agent import load_tools

    try:
        prompted = set(load_tools(path))
    except Exception as e:  # the loader's message names the file, the entry and the class
        p.errors.append(f"data.tool_config_path: {type(e).__name__}: {e}")
        return
    missing = sorted(prompted - callable_)
    p.check(not missing, f"data.tool_config_path={path} declares tool(s) {missing} in the prompts that "
                         f"{key}.tool_config_path={m.tool_config_path} does not provide: the model would call tools "
                         "that nothing answers")
