"""The one place the side-by-side job's settings live; both trainers' command lines are generated from it.

    python benchmarks/peer_verl/settings.py ours|verl smol|1p5b --model DIR --out DIR [--steps N]

prints one Hydra override per line (run.sh reads them with mapfile). hybridrl took verl's key names, so SHARED is
one list of `key=value` pairs passed verbatim to both; SIDE holds only what differs by trainer and why.
"""
from __future__ import annotations

import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REWARD = os.path.join(HERE, "reward.py")

# GRPO, identical on both sides. Batch sizes count prompts (mini) or samples (micro), as in verl.
JOBS: dict[str, dict] = {
    # SmolLM2-135M-Instruct + gsm_symbolic, as configs/grpo_smollm2_gsm8k.yaml (the train score plateaus by step
    # ~20 there: benchmarks/results/grpo_smollm2_metrics.jsonl), validation before and after.
    "smol": {
        "data.train_files": f"[{REPO}/benchmarks/data/gsm_symbolic/train.parquet]",
        "data.val_files": f"[{REPO}/benchmarks/data/gsm_symbolic/test.parquet]",
        "data.max_prompt_length": 256,
        "data.max_response_length": 256,
        "data.train_batch_size": 64,
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 32,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.rollout.ignore_eos": False,
        "trainer.total_training_steps": 20,
        "trainer.val_before_train": True,
        "trainer.test_freq": 20,
    },
    # A random Qwen2-shaped 1.5B (benchmarks/multi_gpu_bench.py model, its demo tokenizer and arithmetic data),
    # full-length responses (ignore_eos): the training engine's share of the step grows with the model.
    "1p5b": {
        "data.train_files": "[{model}/data/train.parquet]",
        "data.val_files": "[{model}/data/test.parquet]",
        "data.max_prompt_length": 64,
        "data.max_response_length": 256,
        "data.train_batch_size": 32,
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
        "actor_rollout_ref.rollout.ignore_eos": True,
        "trainer.total_training_steps": 5,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
    },
}

SHARED: dict[str, object] = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "data.filter_overlong_prompts": True,
    "data.shuffle": True,
    "data.seed": 1,
    "actor_rollout_ref.actor.optim.lr": 1.0e-5,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": -1,
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    # verl's default is on; hybridrl's off: both off (memory is not short on an H100 at these sizes).
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    # Packing (remove padding) needs flash-attn in verl, which the host lacks: padded batches on both sides.
    "actor_rollout_ref.model.use_remove_padding": False,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
    "actor_rollout_ref.rollout.enforce_eager": False,  # CUDA graphs on in both
    "actor_rollout_ref.rollout.free_cache_engine": True,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 8192,
    "actor_rollout_ref.rollout.seed": 0,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 0,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    # verl 0.9.1's main_ppo reads the reward function only from reward.custom_reward_function and silently ignores
    # the older top-level custom_reward_function (the first leases ran verl's built-in gsm8k scorer that way).
    "reward.custom_reward_function.path": REWARD,
    "reward.custom_reward_function.name": "compute_score",
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 1,
    "trainer.total_epochs": 1,
    "trainer.save_freq": -1,
    "trainer.device": "cuda",
}


def side(trainer: str, job: str, model: str, out: str) -> list[str]:
    """Overrides that differ by trainer, each with its reason."""
    name = f"peer_verl_{job}"
    if trainer == "ours":
        return [
            "--config-name", "grpo_trainer" if job == "1p5b" else "grpo_smollm2_gsm8k",
            f"actor_rollout_ref.model.path={model}",
            # the HF folder materialized from the GGUF (verl reads the same one): the smol config's gguf_file is not in it
            "actor_rollout_ref.model.gguf_file=null",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[console,jsonl]",
            f"trainer.validation_data_dir={out}/val_gens",
            f"trainer.experiment_name={name}",
        ]
    if trainer == "verl":
        return [
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.actor.strategy=fsdp",  # verl's default backend (its Megatron one needs TE: verl.md)
            # No flash-attn on the host (PyPI has only its sdist): torch's SDPA, as hybridrl's local spec uses.
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            # Without flash-attn, verl's logprobs_from_logits falls back to logprobs_from_logits_v2, a Python loop
            # over every token (165k per pass at this job's size: 10-40 s per phase on 135M, first lease). verl's
            # images have flash-attn's Triton cross-entropy instead; the closest verl-native path here is its fused
            # linear + log-prob kernel (torch backend, verl's default impl_backend), which materializes no logits.
            "actor_rollout_ref.model.use_fused_kernels=true",
            f"trainer.validation_data_dir={out}/val_gens",
            # verl's file logger (VERL_FILE_LOGGER_PATH, set by run.sh) writes {"step", "data"} per step.
            "trainer.logger=[console,file]",
            "trainer.project_name=peer_verl",
            f"trainer.experiment_name={name}",
            f"trainer.default_local_dir={out}/ckpt",
            # Logical Ray CPUs: TransferQueue reserves ~12 (with fewer, tq.init waits for ever), plus 8 reward
            # workers, the agent loop and the task runner; 32 leaves no actor waiting for a CPU on 16 cores.
            "ray_kwargs.ray_init.num_cpus=32",
        ]
    raise ValueError(f"trainer={trainer!r}: expected ours or verl")


def fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def overrides(trainer: str, job: str, model: str, out: str, steps: int | None = None) -> list[str]:
    if job not in JOBS:
        raise ValueError(f"job={job!r}: expected one of {sorted(JOBS)}")
    merged = {**SHARED, **JOBS[job]}
    if steps is not None:
        merged["trainer.total_training_steps"] = steps
        if merged["trainer.test_freq"] != -1:
            merged["trainer.test_freq"] = steps
    shared = [f"{k}={fmt(v).format(model=model)}" for k, v in merged.items()]
    return side(trainer, job, model, out) + shared


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trainer", choices=["ours", "verl"])
    ap.add_argument("job", choices=sorted(JOBS))
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args(argv)
    print("\n".join(overrides(args.trainer, args.job, args.model, args.out, args.steps)))


if __name__ == "__main__":
    main()
