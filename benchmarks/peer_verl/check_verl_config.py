"""Does verl 0.9.1 accept settings.py's command lines? Composes verl's own Hydra config (verl/trainer/config,
ppo_trainer, the overrides exactly as rows.py passes them), runs the checks its main_ppo runs before starting Ray
(validate_config) and builds the typed configs its workers build from it (actor, ref, rollout, engine dataclasses:
their __post_init__ checks), for each (trainer, job). No GPU, no Ray, no model weights.

    PYTHONPATH=VERL_SITE python benchmarks/peer_verl/check_verl_config.py --model TINY_QWEN2_DIR [--out FILE.json]

TINY_QWEN2_DIR: any Qwen2 HF folder with data/train.parquet and data/test.parquet (multi_gpu_bench.py model
--shape tiny writes one); it stands in for the real models, whose size verl's config checks never read.
Prints one line per (trainer, job) and the resolved values that matter (strategy, bridge, packing, dynamic
batches, offloads, recompute, attention backend, layout).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import settings  # noqa: E402

KEYS = [  # resolved values printed for each (trainer, job)
    "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.model.enable_gradient_checkpointing", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.actor.megatron.vanilla_mbridge", "actor_rollout_ref.actor.megatron.use_remove_padding",
    "actor_rollout_ref.actor.megatron.param_offload", "actor_rollout_ref.actor.megatron.optimizer_offload",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "actor_rollout_ref.actor.megatron.sequence_parallel",
    "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend",
    "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity",
    "actor_rollout_ref.ref.megatron.override_transformer_config.attention_backend",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "trainer.n_gpus_per_node",
]


def select(cfg, key):
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception as e:  # noqa: BLE001
        return f"<{type(e).__name__}>"


def check(trainer: str, job: str, model: str, gpu_gib: float) -> dict:
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    args = settings.overrides(trainer, job, model, "/tmp/peer_verl_check", gpu_gib=gpu_gib)
    result: dict = {"trainer": trainer, "job": job, "gpu_gib": gpu_gib, "overrides": args}
    stage = "compose"
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                                   version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=args)
        stage = "validate_config"
        use_ref, use_critic = need_reference_policy(cfg), need_critic(cfg)
        result["uses_reference"], result["uses_critic"] = bool(use_ref), bool(use_critic)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            validate_config(config=cfg, use_reference_policy=use_ref, use_critic=use_critic)
            stage = "resolve"
            OmegaConf.resolve(cfg)
            # the typed configs verl's workers build (engine_workers: actor/ref/rollout/model config dataclasses)
            stage = "actor dataclass"
            actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
            if use_ref:
                stage = "ref dataclass"
                # engine_workers.init_model renames the ref's log_prob_* keys to the actor's names first
                from omegaconf import open_dict

                ref = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.ref))
                with open_dict(ref):
                    ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
                    for old, new in (("log_prob_micro_batch_size", "ppo_micro_batch_size"),
                                     ("log_prob_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"),
                                     ("log_prob_use_dynamic_bsz", "use_dynamic_bsz"),
                                     ("log_prob_max_token_len_per_gpu", "ppo_max_token_len_per_gpu")):
                        ref[new] = ref.pop(old, None)
                ref_cfg = omega_conf_to_dataclass(ref)
                result["ref_engine"] = {k: getattr(getattr(ref_cfg, "megatron", None), k, None) for k in
                                        ("param_offload", "vanilla_mbridge", "use_remove_padding", "forward_only")}
            stage = "rollout dataclass"
            omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
            stage = "model dataclass"
            from verl.workers.config import HFModelConfig

            omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
            engine = getattr(actor, "megatron", None) if trainer == "verl_megatron" else getattr(actor, "fsdp_config", None)
            result["actor_config"] = type(actor).__name__
            result["engine_config"] = type(engine).__name__ if engine is not None else None
            if engine is not None:
                result["engine"] = {k: getattr(engine, k) for k in
                                    ("param_offload", "optimizer_offload", "sequence_parallel", "use_remove_padding",
                                     "vanilla_mbridge", "tensor_model_parallel_size") if hasattr(engine, k)}
        result["warnings"] = sorted({str(w.message)[:200] for w in caught})
        result["values"] = {k: select(cfg, k) for k in KEYS}
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001
        result["ok"] = False
        result["stage"] = stage
        result["error"] = f"{type(e).__name__}: {e}"[:1500]
        result["traceback"] = traceback.format_exc()[-3000:]
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--trainers", nargs="*", default=["verl", "verl_megatron"])
    ap.add_argument("--jobs", nargs="*", default=sorted(settings.JOBS))
    ap.add_argument("--gpu-gib", type=float, nargs="*", default=[80.0, 140.0])
    args = ap.parse_args(argv)
    results = []
    for gib in args.gpu_gib:
        for trainer in args.trainers:
            for job in args.jobs:
                r = check(trainer, job, os.path.abspath(args.model), gib)
                results.append(r)
                if r["ok"]:
                    vals = {k.replace("actor_rollout_ref.", ""): v for k, v in r["values"].items() if v is not None}
                    print(f"ok   {trainer} {job} ({gib:.0f} GiB): {r['actor_config']}/{r['engine_config']}, "
                          f"ref {r['uses_reference']}; " + ", ".join(f"{k}={v}" for k, v in vals.items()), flush=True)
                else:
                    print(f"FAIL {trainer} {job} ({gib:.0f} GiB) at {r['stage']}: {r['error']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
