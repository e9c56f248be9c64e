"""The one place the side-by-side jobs' settings live; every trainer's command line is generated from it.

    python benchmarks/peer_verl/settings.py TRAINER JOB --model DIR --out DIR [--steps N] [--gpu-gib G] [--padded]

TRAINER: ours (hybridrl), verl (verl 0.9.1, FSDP backend), verl_megatron (verl 0.9.1, Megatron backend through
mbridge and transformer-engine). JOB: smol, 1p5b, 7b (one GPU), 7b_4gpu (tp2 x dp2 training, vLLM tp2 x dp2).
Prints one Hydra override per line (rows.py calls overrides() itself). hybridrl took verl's key names, so SHARED + the
job's dict are passed verbatim to every trainer; side() holds only what differs by trainer (each backend's best
documented settings, the layout in its own keys, paths), each with its reason.

--padded: issue 18's settings (padded batches, fixed micro-batch sizes on both sides: verl's FSDP packing needs
flash-attn, which the GPU host lacks), for the runs peer_verl.md reports. Without it each trainer gets its best
documented settings (issue 34): packed sequences where the backend packs here, micro-batches cut by tokens.
--gpu-gib: the GPU's memory; below 100 (H100) the 7B jobs add the offloads each trainer needs on 80 GB.
"""
from __future__ import annotations

import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REWARD = os.path.join(HERE, "reward.py")
TRAINERS = ("ours", "verl", "verl_megatron")
ARA = "actor_rollout_ref"

# GRPO, identical on both sides. Batch sizes count prompts (mini) or samples (micro), as in verl.
# What the 7B jobs share (the 1-GPU and the 4-GPU one differ in layout, token budget and steps)
SEVEN_B: dict[str, object] = {
    "data.train_files": "[{model}/data/train.parquet]",
    "data.val_files": "[{model}/data/test.parquet]",
    "data.max_prompt_length": 64,
    "data.max_response_length": 256,
    "data.train_batch_size": 16,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.rollout.ignore_eos": True,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "trainer.val_before_train": False,
    "trainer.test_freq": -1,
}

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
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "trainer.n_gpus_per_node": 1,
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
        # micro-batches cut by tokens (not --padded): benchmarks/four_gpu.py's 1.5B budget
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "trainer.n_gpus_per_node": 1,
        "trainer.total_training_steps": 5,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
    },
    # The random Qwen2.5-7B shape (multi_gpu_bench.py model --shape 7b), benchmarks/four_gpu.py's 7B job: 16 prompts x
    # 8 samples x 256 tokens, no KL loss (so no reference model on either side; the host's memory is short at 7B).
    # One GPU: 7.6B x 18 bytes of training state (137 GB) fits only an H200, with offloads and recompute (side()).
    "7b": {
        **SEVEN_B,
        # megatron_scale's one-GPU 7B budget (4096 tokens a micro-batch, with recompute)
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 4096,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "trainer.n_gpus_per_node": 1,
        # verl moves 91 GB of optimizer state each way every step here: 4 steps (3 timed) fit one device call
        "trainer.total_training_steps": 4,
    },
    # The same 7B job on 4 GPUs: tp2 x dp2 training, vLLM tp2 x dp2 (two replicas) on both sides (the layout's keys
    # differ by trainer: side()); four_gpu.py's 7b_tp2dp2 row's 8192-token budget (half the state a GPU, no recompute).
    "7b_4gpu": {
        **SEVEN_B,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
        "trainer.n_gpus_per_node": 4,
        "trainer.total_training_steps": 5,
    },
}
# the GPUs each job runs on (rows.py and report.py read it)
GPUS = {"smol": 1, "1p5b": 1, "7b": 1, "7b_4gpu": 4}

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
    # Packing (use_remove_padding), micro-batches by tokens (use_dynamic_bsz) and recompute differ by backend and
    # job: side().
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
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
    "trainer.total_epochs": 1,
    "trainer.save_freq": -1,
    "trainer.device": "cuda",
}


RECOMPUTE_MCORE = [  # verl's Megatron recompute keys (its best_practices page: full, uniform, 1 layer a checkpoint)
    f"{ARA}.actor.megatron.override_transformer_config.recompute_granularity=full",
    f"{ARA}.actor.megatron.override_transformer_config.recompute_method=uniform",
    f"{ARA}.actor.megatron.override_transformer_config.recompute_num_layers=1",
]


def best(trainer: str, job: str, gpu_gib: float) -> list[str]:
    """Each backend's best documented settings for the job (issue 34), each with its reason."""
    small = gpu_gib < 100  # an 80 GB card (H100): the 7B jobs need more offloading there
    if trainer == "ours":
        out = [
            # transformer-engine's layer spec where TE imports (the GPU host: benchmarks/te), packed THD micro-batches
            # cut by tokens: what benchmarks/four_gpu.py and megatron_scale run
            f"{ARA}.model.use_remove_padding=true",
            f"{ARA}.actor.use_dynamic_bsz=true",
        ]
        if job == "7b":  # megatron_scale's 7b row: recompute, the optimizer state on the host except during its
            # step (the hybrid engine's optimizer_offload; 131 GiB peak on an H200, `hybridrl plan` refuses it on 80 GB)
            out += [f"{ARA}.model.enable_gradient_checkpointing=true", f"{ARA}.actor.megatron.optimizer_offload=true",
                    f"{ARA}.actor.load_weight=false"]  # random init: the folder's weights are for verl (no dummy init)
        elif job == "7b_4gpu":
            out += [f"{ARA}.actor.megatron.tensor_model_parallel_size=2", f"{ARA}.actor.load_weight=false",
                    f"{ARA}.model.enable_gradient_checkpointing=false"]
            if small:  # four_gpu.py's 7b_tp2dp2 row on H100s (knobs_80gb)
                out.append(f"{ARA}.actor.megatron.optimizer_offload=true")
        else:
            # megatron.optimizer_offload=false (the default) keeps the optimizer state on the GPU through generation,
            # as verl does without its offload
            out.append(f"{ARA}.model.enable_gradient_checkpointing=false")
        return out
    if trainer == "verl":
        out = [
            # verl's FSDP packing (remove padding) runs flash-attn's varlen kernels; the host has no flash-attn
            # (PyPI has only its sdist): padded batches, torch's SDPA
            f"{ARA}.model.use_remove_padding=false",
            # verl's perf_tuning page: micro-batches by tokens (each still padded to its longest sequence here)
            f"{ARA}.actor.use_dynamic_bsz=true",
        ]
        if job in ("7b", "7b_4gpu"):
            # verl's FSDP default (recompute on): 7.6B fp32 params + grads + Adam = 122 GB, 30 GB a GPU over 4
            out.append(f"{ARA}.model.enable_gradient_checkpointing=true")
            if small:  # verl's documented FSDP offloads when memory is short (H100: vLLM's 0.4 beside the state)
                out += [f"{ARA}.actor.fsdp_config.optimizer_offload=true"]
        else:  # verl's default is on; memory is not short on one GPU at these sizes (issue 18's setting)
            out.append(f"{ARA}.model.enable_gradient_checkpointing=false")
        return out
    if trainer == "verl_megatron":
        out = [
            # packing: verl's Megatron engine packs to THD (megatron.use_remove_padding, its default) and runs it
            # through transformer-engine; no flash-attn package needed with the fused (cuDNN) backend below
            f"{ARA}.model.use_remove_padding=true",
            f"{ARA}.actor.megatron.use_remove_padding=true",
            f"{ARA}.actor.use_dynamic_bsz=true",
        ]
        if job == "7b":
            # one GPU (an H200: 137 GB of training state): verl's documented optimizer offload (the Adam state and
            # fp32 masters, 91 GB, on the host between updates; verl loads them back for the whole update) and full
            # recompute, ours' 4096-token budget. Not its param_offload: params + fp32 grads (45 GB) on the host
            # beside the optimizer's 91 GB would pass the host's 125 GiB of RAM. Not megatron's CPU Adam
            # (optimizer_cpu_offload): its host copies of masters, moments and grads (121 GB) ran hybridrl's 7B host
            # out of memory (megatron_scale.md).
            out += [f"{ARA}.actor.megatron.optimizer_offload=true", *RECOMPUTE_MCORE]
        elif job == "7b_4gpu":
            out += [f"{ARA}.actor.megatron.tensor_model_parallel_size=2"]
            # 141 GB: 46 GB of state a GPU beside vLLM's 0.4 fits without offloads.
            if small:  # 80 GB: the same offloads as verl's 7B examples (run_qwen2-7b_seq_balance_math_megatron.sh;
                # 0.9.1 has no grad_offload key: param_offload releases the grad buffers too). The 4-GPU host's RAM
                # (512 GiB) holds the 4 x 46 GB.
                out += [f"{ARA}.actor.megatron.param_offload=true", f"{ARA}.actor.megatron.optimizer_offload=true"]
        return out
    raise ValueError(f"trainer={trainer!r}: expected one of {TRAINERS}")


def side(trainer: str, job: str, model: str, out: str, padded: bool = False, gpu_gib: float = 80.0) -> list[str]:
    """Overrides that differ by trainer, each with its reason."""
    name = f"peer_verl_{job}" + ("" if trainer != "verl_megatron" else "_megatron")
    if padded:  # issue 18's runs: padded batches, fixed micro-batch sizes, recompute off, on both sides
        if trainer == "verl_megatron" or job not in ("smol", "1p5b"):
            raise ValueError("--padded is issue 18's setting: trainers ours and verl, jobs smol and 1p5b")
        tuning = [f"{ARA}.model.use_remove_padding=false", f"{ARA}.actor.use_dynamic_bsz=false",
                  f"{ARA}.model.enable_gradient_checkpointing=false"]
    else:
        tuning = best(trainer, job, gpu_gib)
    if trainer == "ours":
        return [
            "--config-name", "grpo_smollm2_gsm8k" if job == "smol" else "grpo_trainer",
            f"{ARA}.model.path={model}",
            # the HF folder materialized from the GGUF (verl reads the same one): the smol config's gguf_file is not in it
            f"{ARA}.model.gguf_file=null",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[console,jsonl]",
            f"trainer.validation_data_dir={out}/val_gens",
            f"trainer.experiment_name={name}",
            *tuning,
        ]
    if trainer not in ("verl", "verl_megatron"):
        raise ValueError(f"trainer={trainer!r}: expected one of {TRAINERS}")
    common = [
        f"{ARA}.model.path={model}",
        f"trainer.validation_data_dir={out}/val_gens",
        # verl's file logger (VERL_FILE_LOGGER_PATH, set by rows.py) writes {"step", "data"} per step.
        "trainer.logger=[console,file]",
        "trainer.project_name=peer_verl",
        f"trainer.experiment_name={name}",
        f"trainer.default_local_dir={out}/ckpt",
        # Logical Ray CPUs: TransferQueue reserves ~12 (with fewer, tq.init waits for ever), plus 8 reward
        # workers, the agent loop and the task runner; 32 leaves no actor waiting for a CPU on 16 cores.
        "ray_kwargs.ray_init.num_cpus=32",
    ]
    if trainer == "verl":
        return [
            f"{ARA}.actor.strategy=fsdp",  # verl's default backend
            # No flash-attn on the host (PyPI has only its sdist): torch's SDPA, as hybridrl's local spec uses.
            f"+{ARA}.model.override_config.attn_implementation=sdpa",
            # Without flash-attn, verl's logprobs_from_logits falls back to logprobs_from_logits_v2, a Python loop
            # over every token (165k per pass at this job's size: 10-40 s per phase on 135M, first lease). verl's
            # images have flash-attn's Triton cross-entropy instead; the closest verl-native path here is its fused
            # linear + log-prob kernel (torch backend, verl's default impl_backend), which materializes no logits.
            f"{ARA}.model.use_fused_kernels=true",
            *common, *tuning,
        ]
    return [
        # verl's Megatron backend: the Hydra group model_engine=megatron selects megatron_actor/_ref (strategy
        # megatron), what verl's deprecated ppo_megatron_trainer.yaml does.
        "model_engine=megatron",
        # verl 0.9.1 builds the model through Megatron-Bridge by default; its [megatron] extra pins 0.5.2, which the
        # index lacks (0.3.1 there declares transformers<5 and transformer-engine<2.13). mbridge 0.15.1 (verl's
        # [mcore] extra; the legacy path, deprecated but kept in 0.9.1) is selected by vanilla_mbridge.
        f"{ARA}.actor.megatron.vanilla_mbridge=true",
        # verl's default attention_backend=flash makes transformer-engine use only the flash-attn package's kernels,
        # absent here: fused is TE's cuDNN attention, which runs the packed THD batches (the ref follows the actor).
        f"{ARA}.actor.megatron.override_transformer_config.attention_backend=fused",
        # verl's Megatron worker reads the parallel sizes of the ref from the actor's (oc.select) and keeps its
        # defaults otherwise: sequence_parallel on under tp>1, the distributed optimizer.
        *common, *tuning,
    ]


def fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def overrides(trainer: str, job: str, model: str, out: str, steps: int | None = None, padded: bool = False,
              gpu_gib: float = 80.0) -> list[str]:
    if job not in JOBS:
        raise ValueError(f"job={job!r}: expected one of {sorted(JOBS)}")
    merged = {**SHARED, **JOBS[job]}
    if padded:  # issue 18's command lines exactly: no token budget (unused with fixed micro-batches)
        merged.pop("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", None)
    if steps is not None:
        merged["trainer.total_training_steps"] = steps
        if merged["trainer.test_freq"] != -1:
            merged["trainer.test_freq"] = steps
    shared = [f"{k}={fmt(v).format(model=model)}" for k, v in merged.items()]
    return side(trainer, job, model, out, padded, gpu_gib) + shared


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trainer", choices=TRAINERS)
    ap.add_argument("job", choices=sorted(JOBS))
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--padded", action="store_true", help="issue 18's settings (padded, fixed micro-batches)")
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="GPU memory; under 100 adds the 80 GB offloads")
    ap.add_argument("--gpus", action="store_true", help="print the job's GPU count only")
    args = ap.parse_args(argv)
    if args.gpus:
        print(GPUS[args.job])
        return
    print("\n".join(overrides(args.trainer, args.job, args.model, args.out, args.steps, args.padded, args.gpu_gib)))


if __name__ == "__main__":
    main()
