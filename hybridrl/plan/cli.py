"""`hybridrl plan [preset=NAME] [key=value ...] [--gpu-mem-gb 80] [--model-config PATH] [--json]`

Prints the layout validate() derives and a per-GPU memory table for the training and rollout phases, and
refuses (exit status 2, the message naming the key to turn) a layout the model does not divide into or one
that does not fit. Takes the same config arguments as `hybridrl train` (`--config FILE`, `--preset NAME`,
`--config-name`, key=value overrides). The plan is for GPUs unless trainer.device=cpu, so it can be made on
a machine without one. The model's shape comes from --model-config (a model folder, its config.json, or a
built-in name such as Qwen2.5-7B), else from actor_rollout_ref.model.path. See report.py for the JSON keys
and memory.py for the formulas.

`--search [--gpus N] [--gpu-type H100|H200] [--top K]` ranks every layout of the job's GPUs that fits (training
tp/pp/dp, rollout tp_g, optimizer offload, recompute) by the step time step_time.py predicts, and prints the
fastest one's overrides (search.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from hybridrl.config import ConfigError, load_config, validate
from hybridrl.config.cli import normalize_argv, parse_command_line

from .checks import Problem, fit_problems, shape_notes, shape_problems
from .estimate import estimate
from .memory import GiB
from .model_shape import KNOWN_CONFIGS, ModelShape, ModelShapeError, resolve
from .report import table, to_json_dict, verdict

EXIT_REFUSED = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybridrl plan", description=__doc__.split("\n\n")[1], allow_abbrev=False,
                                epilog=f"built-in model shapes: {', '.join(KNOWN_CONFIGS)}")
    p.add_argument("--gpu-mem-gb", type=float, default=80.0, help="memory of one GPU in GiB (default 80)")
    p.add_argument("--overhead-gb", type=float, default=3.0,
                   help="per-GPU allowance for CUDA context, NCCL buffers, allocator slack (GiB, default 3)")
    p.add_argument("--model-config", default=None, help="model folder, config.json, or built-in name")
    p.add_argument("--critic-model-config", default=None, help="the critic's, when it differs from the actor's")
    p.add_argument("--reward-model-config", default=None,
                   help="the reward model's (reward_model.enable); default: reward_model.model.path where it exists")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (keys in hybridrl/plan/report.py)")
    p.add_argument("--search", action="store_true",
                   help="rank every layout that fits by predicted step time (hybridrl/plan/search.py)")
    p.add_argument("--gpus", type=int, default=None,
                   help="with --search: GPUs in all (up to 8 a node; more in whole nodes of 8); default: the job's")
    p.add_argument("--gpu-type", default=None, help="with --search: H100 or H200 (default: H200 above 100 GiB)")
    p.add_argument("--top", type=int, default=10, help="with --search: layouts to print")
    p.add_argument("--net-gbps", type=float, default=None,
                   help="with --search: network bandwidth between nodes per GPU in Gb/s (default 400: one 400G NIC a GPU)")
    return p


def _is_placeholder(path: str) -> bool:
    """The schema's default model path (verl's deepseek-llm-7b placeholder), absent here: the user named no model."""
    from hybridrl.config.schema.actor import ModelConfig

    return path == ModelConfig().path and not os.path.exists(os.path.expanduser(path))


def _refuse(problems: list[Problem], as_json: bool, gpu_bytes: int, run=None, shape=None) -> int:
    if as_json:
        print(json.dumps(to_json_dict(run, shape, None, problems, [], gpu_bytes), indent=2))
    for p in problems:
        print(f"hybridrl plan: {p.message}", file=sys.stderr)
    return EXIT_REFUSED


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, rest = _parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    gpu_bytes = int(args.gpu_mem_gb * GiB)
    cl = parse_command_line(normalize_argv(rest))  # --preset, --config as `hybridrl train`
    try:
        cfg = load_config(cl.overrides, cl.config_name, cl.config_path)
        # plan for GPUs (with transformer-engine where asked) unless trainer.device=cpu
        run = validate(cfg, cuda_available=lambda: True, te_available=lambda: True)
    except ConfigError as e:
        return _refuse([Problem(None, str(e))], args.json, gpu_bytes)
    ara = cfg.actor_rollout_ref
    if args.search:
        return _search(args, cl, cfg, gpu_bytes)
    if not args.model_config and _is_placeholder(ara.model.path):
        return _refuse([Problem(None, f"no model to plan for: actor_rollout_ref.model.path is the default "
                                      f"placeholder {ara.model.path} (not on this machine); pass --model-config (a model "
                                      f"folder, its config.json or one of {', '.join(KNOWN_CONFIGS)}) or "
                                      "actor_rollout_ref.model.path=FOLDER")], args.json, gpu_bytes, run)
    try:
        shape = resolve(args.model_config or ara.model.path, ara.model.override_config)
        critic_shape = resolve(args.critic_model_config, cfg.critic.model.override_config) if args.critic_model_config else None
        rm_shape = _reward_model_shape(args, cfg) if run.derived.reward.model else None
    except ModelShapeError as e:
        return _refuse([Problem(None, str(e))], args.json, gpu_bytes, run)
    plan = estimate(run, shape, gpu_bytes, int(args.overhead_gb * GiB), critic_shape, rm_shape)
    problems = shape_problems(run, shape) + fit_problems(plan, run, shape)
    notes = shape_notes(run, shape) + plan.notes
    if args.json:
        print(json.dumps(to_json_dict(run, shape, plan, problems, notes, gpu_bytes), indent=2))
    else:
        print(table(run, shape, plan))
    text = verdict(plan, problems, notes, run.derived.device)
    print(text, file=sys.stderr if (problems or args.json) else sys.stdout)
    return EXIT_REFUSED if problems else 0


def _reward_model_shape(args: argparse.Namespace, cfg) -> Optional[ModelShape]:
    """--reward-model-config, else reward_model.model.path where it is on this machine (None: estimate's fallback)."""
    rm = cfg.reward_model.model
    where = args.reward_model_config or (rm.path if os.path.exists(os.path.expanduser(rm.path)) else None)
    return resolve(where, rm.override_config) if where else None


def _search(args: argparse.Namespace, cl, cfg, gpu_bytes: int) -> int:
    from .search import MAX_GPUS, search, table
    from .step_time import Network, gpu_named

    t = cfg.trainer
    gpus = args.gpus or t.n_gpus_per_node * t.nnodes
    per_node = min(gpus, 8)
    if gpus > MAX_GPUS:
        return _refuse([Problem(None, f"--gpus {gpus}: the search covers up to {MAX_GPUS} GPUs")], args.json, gpu_bytes)
    if gpus % per_node:
        return _refuse([Problem(None, f"--gpus {gpus}: more than 8 GPUs come in whole nodes of 8")], args.json, gpu_bytes)
    nodes = [f"trainer.n_gpus_per_node={per_node}", f"trainer.nnodes={gpus // per_node}"]
    try:
        gpu = gpu_named(args.gpu_type or ("H200" if args.gpu_mem_gb > 100 else "H100"))
        shape = resolve(args.model_config or cfg.actor_rollout_ref.model.path, cfg.actor_rollout_ref.model.override_config)
    except (ValueError, ModelShapeError) as e:
        return _refuse([Problem(None, str(e))], args.json, gpu_bytes)

    def build(extra: list[str]):
        job = load_config(cl.overrides + nodes + extra, cl.config_name, cl.config_path)
        return validate(job, cuda_available=lambda: True, te_available=lambda: True)

    net = Network(gbps_per_gpu=args.net_gbps) if args.net_gbps else Network()
    sequence = cfg.data.max_prompt_length + cfg.data.max_response_length
    fits, refused = search(build, shape, gpus, per_node, gpu_bytes, int(args.overhead_gb * GiB), gpu, net=net,
                           sequence=sequence)
    if args.json:
        print(json.dumps({"format": "hybridrl.plan.search/1", "gpus": gpus, "gpu": gpu.name, "gpu_memory_bytes": gpu_bytes,
                          "network_gbps_per_gpu": net.gbps_per_gpu,
                          "model": shape.to_dict(), "ranked": [c.to_dict() for c in fits],
                          "refused": [c.to_dict() for c in refused]}, indent=2))
    else:
        print(f"{shape.name} on {gpus} x {gpu.name} ({args.gpu_mem_gb:g} GiB, {net.gbps_per_gpu:g} Gb/s a GPU between "
              f"nodes): {len(fits)} layouts fit, "
              f"{len(refused)} refused (--json says why)")
        print(table(fits, args.top))
    if not fits:
        print("hybridrl plan --search: no layout fits; more GPUs, shorter micro-batches "
              "(actor_rollout_ref.actor.ppo_max_token_len_per_gpu) or a smaller rollout share "
              "(actor_rollout_ref.rollout.gpu_memory_utilization)", file=sys.stderr)
        return EXIT_REFUSED
    print("fastest: " + " ".join(nodes + fits[0].overrides()), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
