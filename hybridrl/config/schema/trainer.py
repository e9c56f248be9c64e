"""trainer.*: run length, logging, checkpoints, cluster shape, and ray_kwargs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .common import doc


@dataclass(frozen=True)
class TrainerConfig:
    balance_batch: bool = doc("Reorder samples so every dp rank gets a similar token count.", True)
    balance_batch_sort: bool = doc(
        "With balance_batch, also order each dp rank's samples by length, short ones at both ends, as verl 0.9.1 "
        "does (at dp=1 too): its mini-batches then hold about half of every GRPO group. Off: samples keep the "
        "rollout order and a group stays in one mini-batch.", False)
    total_epochs: int = 30
    total_training_steps: Optional[int] = doc("null: epochs x batches per epoch.", None)
    project_name: str = "verl_examples"
    experiment_name: str = "gsm8k"
    logger: list[str] = doc("Any of console, jsonl, tensorboard, wandb (verl defaults to console+wandb; we default to console so a first run needs no account).", factory=lambda: ["console"])
    log_val_generations: int = 0
    nnodes: int = 1
    n_gpus_per_node: int = doc("GPUs per node (on CPU: worker processes per node).", 8)
    save_freq: int = doc("Save a checkpoint every N steps and after the last step (-1: never).", -1)
    esi_redundant_time: int = 0
    resume_mode: str = doc("auto | disable | resume_path", "auto")
    resume_from_path: Optional[str] = None
    del_local_ckpt_after_load: bool = False
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1
    critic_warmup: int = 0
    default_hdfs_dir: Optional[str] = None
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: Optional[int] = None
    max_critic_ckpt_to_keep: Optional[int] = None
    ray_wait_register_center_timeout: int = 300
    device: str = doc("auto | cuda | cpu", "auto")
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    # hybridrl additions
    backend: str = doc("ray | local (torchrun, one process per rank, no Ray).", "ray")
    worker_timeout_s: float = doc("A worker call that takes longer fails naming the rank and role.", 1800.0)
    dist_timeout_s: float = doc("torch.distributed (NCCL/gloo) collective timeout.", 600.0)
    numa_affinity: bool = doc("Pin each GPU worker to the CPU cores of its GPU's NUMA node (sysfs local_cpulist); "
                              "no effect on CPU or where the kernel lists none.", False)
    on_nonfinite: str = doc("error | skip: what a NaN/Inf loss or grad norm does to the step.", "error")
    memory_check: str = doc(
        "error | warn | skip: on GPUs, before Ray and the workers start, the job's memory plan (`hybridrl plan`) for "
        "the smallest GPU this process sees; error stops a job with a phase that does not fit, naming the phase and "
        "the keys to turn; warn logs that and starts anyway (the plan is a model: measured peaks 0.83-1.14x of it); "
        "skip skips it. Skipped, with a logged line, on a Ray cluster the trainer joins.", "error")
    max_time_s: Optional[float] = doc("Stop after the step that passes this many seconds of training (then the "
                                      "final validation and checkpoint run); null: no limit.", None)
    one_step_off_policy: bool = doc(
        "Generate step k+1 while step k trains, on the rollout's own GPUs (actor_rollout_ref.hybrid_engine=false); "
        "each batch is one policy version old and corrected by importance weights against the rollout's log-probs.",
        False)
    stop_grace_s: float = doc(
        "After SIGTERM/SIGINT, the run finishes the step in flight and saves it; if that takes longer than this "
        "(under torchrun: at most its shutdown timeout less 5 s), it stops at once naming the last good checkpoint. "
        "A second signal stops at once.", 60.0)
    overwrite_existing_run: bool = doc(
        "With resume_mode=disable, a default_local_dir that already holds a run (global_step_* folders, the latest "
        "marker, logs/) is refused; true deletes those first and starts afresh there. Other files are left alone.",
        False)
    seed: int = 1
    progress_bar: bool = True
    plot: bool = doc("Write a PNG of score, response length and KL at the end.", True)


@dataclass(frozen=True)
class RayKwargsConfig:
    ray_init: dict[str, Any] = field(default_factory=lambda: {"num_cpus": None})
    timeline_json_file: Optional[str] = None
    connect_timeout_s: float = doc(
        "Joining a running cluster (ray_init.address, or RAY_ADDRESS): seconds its head may take to answer before "
        "the driver stops with an error naming the address (ray.init alone retries for ~14 minutes).", 30.0)
