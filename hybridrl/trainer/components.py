"""Everything the PPO loop talks to, built once from the validated config.

Data and rewards live on the driver; models live in the worker groups (Ray actors, or this process's
rank under torchrun). With the local (torchrun) backend every rank runs the driver program: all ranks
take the same decisions; only rank 0 writes logs, plots and the trainer state of checkpoints.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch

from hybridrl.algos import AdvantageParams, KLController, RolloutCorrection, build_kl_controller
from hybridrl.config import RunConfig
from hybridrl.config.loader import to_dict
from hybridrl.config.schema.algorithm import AlgorithmConfig
from hybridrl.controller import WorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.reward import RewardManager, RewardOutput

from .checkpoint_manager import CheckpointManager, TrainerState, find_resume_path, load_trainer_state, restore_rng_state
from .generation import ColocatedGeneration, SplitGeneration
from .generation_dump import generation_records, write_generations
from .metrics import causal_training_flops, compute_mfu, peak_flops_for
from .progress import ProgressBar
from .sampling import Generation, RewardFn, Sampler
from .startup import StartupClock
from .tracking import Tracker

if TYPE_CHECKING:  # the data and tokenizer packages load in build(), once the config is known to be valid
    from transformers import PreTrainedTokenizerBase

    from hybridrl.data.loader import PromptLoader


@dataclasses.dataclass
class Components:
    run: RunConfig
    model_dir: str
    tokenizer: "PreTrainedTokenizerBase"
    train_loader: "PromptLoader"
    val_loader: "PromptLoader"
    sampler: Sampler  # generates training samples on `generation` and scores them with the training reward
    val_reward_fn: RewardFn
    actor_group: WorkerGroup
    critic_group: Optional[WorkerGroup]
    generation: Generation  # the colocated hybrid engine, or SplitGeneration over rollout_group
    rollout_group: Optional[WorkerGroup]  # split placement: the rollout's own workers
    tracker: Tracker
    ckpt: CheckpointManager
    progress: ProgressBar
    kl_ctrl: KLController
    adv_params: AdvantageParams
    rollout_correction: Optional[RolloutCorrection]  # effective settings (validate.py); None: off
    total_steps: int
    hf_config: dict
    is_rank0: bool
    backend: str
    startup: StartupClock
    reward_model_group: Optional[WorkerGroup] = None  # reward_model.enable: the reward model's workers (actor's processes)
    resumed_loader_state: Optional[dict] = None  # the loader state of the checkpoint resumed from (None: a fresh start)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, run: RunConfig) -> "Components":
        from hybridrl.data.factory import create_rl_dataset
        from hybridrl.data.loader import make_prompt_loader
        from hybridrl.reward import load_reward_fn, with_overlong_buffer
        from hybridrl.utils.hf_model import materialize_hf_dir
        from hybridrl.workers.common import load_tokenizer_for

        clock = StartupClock()
        cfg, t = run.cfg, run.cfg.trainer
        model = cfg.actor_rollout_ref.model
        model_dir = materialize_hf_dir(model.path, model.gguf_file, weights=_actor_weights_read(run))
        check_model_fits_layout(run, model_dir)
        clock.lap("model")

        def load_data() -> tuple:
            began = time.perf_counter()
            tokenizer = load_tokenizer_for(model_dir, run)
            train = create_rl_dataset(cfg.data.train_files, cfg.data, tokenizer, is_train=True)
            val = create_rl_dataset(cfg.data.val_files, cfg.data, tokenizer, is_train=False)
            train_loader = make_prompt_loader(train, cfg.data, is_train=True)
            val_loader = make_prompt_loader(val, cfg.data, is_train=False)
            # DAPO's overlong buffer shapes validation scores too, as verl's DAPO recipe does
            reward, val_reward = (with_overlong_buffer(
                load_reward_fn(cfg.custom_reward_function, cfg.reward_model.reward_manager, tokenizer,
                               reward_fn_key=cfg.data.reward_fn_key, num_examine=examine),
                cfg.reward_model.overlong_buffer, cfg.data.max_response_length) for examine in (0, t.log_val_generations))
            return tokenizer, train, val, train_loader, val_loader, reward, val_reward, time.perf_counter() - began

        if t.backend == "ray":  # the data loads on a thread while Ray starts (both before the workers, which need both)
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hybridrl-data") as pool:
                loading = pool.submit(load_data)
                _init_ray(run)
                clock.lap("ray_init")
                tokenizer, train, val, train_loader, val_loader, reward, val_reward, data_s = loading.result()
            clock.lap("data")  # what of the data Ray's start did not hide
            clock.parts["data_background"] = data_s
        else:
            tokenizer, train, val, train_loader, val_loader, reward, val_reward, _ = load_data()
            clock.lap("data")
        total = t.total_training_steps or len(train_loader) * t.total_epochs
        actor, critic, rollout, rank0, rm = _spawn_groups(run, model_dir, total, max_rollout_rows(run, len(val)), clock)
        generation = ColocatedGeneration(actor) if rollout is None else SplitGeneration.connect(actor, rollout)
        reward, val_reward = (_model_rewards(run, r, tokenizer, rm, generation) for r in (reward, val_reward))
        if rollout is not None:
            clock.lap("weight_broadcast")
        print(_startup_report(run, model_dir, len(train), len(val), train, total), flush=True)
        loggers = list(t.logger) + (["jsonl"] if t.plot and "jsonl" not in t.logger else [])
        tracker = Tracker(loggers if rank0 else [], t.project_name, t.experiment_name, to_dict(cfg),
                          os.path.join(os.path.expanduser(t.default_local_dir), "logs"))
        kc = cfg.algorithm.kl_ctrl
        return cls(
            run=run, model_dir=model_dir, tokenizer=tokenizer, train_loader=train_loader, val_loader=val_loader,
            sampler=Sampler(generation, reward, cfg.actor_rollout_ref.rollout.temperature), val_reward_fn=val_reward, actor_group=actor, critic_group=critic,
            generation=generation, rollout_group=rollout, tracker=tracker,
            ckpt=CheckpointManager.from_config(t, cfg), progress=ProgressBar.from_config(t, total) if rank0 else
            ProgressBar(total, enabled=False),
            kl_ctrl=build_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon),
            adv_params=advantage_params(cfg.algorithm),
            rollout_correction=None if run.derived.algorithm.rollout_correction is None
            else RolloutCorrection.from_config(run.derived.algorithm.rollout_correction),
            total_steps=total, hf_config=actor.model_info()["hf_config"], is_rank0=rank0, backend=t.backend,
            startup=clock, reward_model_group=rm[0] if rm else None,
        )

    # ------------------------------------------------------------------ data
    def prompt_batches(self) -> Iterator[DataProto]:
        """Training prompt batches from where the loader stands, epochs rolling over (the rollout stream
        decides how many it takes: one per step, more with dynamic sampling)."""
        while True:
            empty = True
            for batch in self.train_loader:
                empty = False
                yield batch
            if empty:
                return

    def val_batches(self) -> Iterator[DataProto]:
        self.val_loader.position = 0  # validation always walks the whole set from its start
        yield from self.val_loader

    # ------------------------------------------------------------------ checkpoints
    def resume(self) -> int:
        path = find_resume_path(self.run.cfg.trainer)
        if path is None:
            return 0
        state = load_trainer_state(path)
        self.actor_group.load_checkpoint(os.path.join(path, "actor"))
        if self.critic_group is not None:
            self.critic_group.load_checkpoint(os.path.join(path, "critic"))
        self.train_loader.load_state_dict(state.dataloader)
        self.resumed_loader_state = state.dataloader  # also what the fully async mode records there (spilled.py)
        if "value" in state.kl_ctrl:
            self.kl_ctrl.value = float(state.kl_ctrl["value"])
        restore_rng_state(state.rng)
        self.progress = ProgressBar.from_config(self.run.cfg.trainer, self.total_steps, state.global_step) \
            if self.is_rank0 else self.progress
        print(f"hybridrl: resumed from {path} (step {state.global_step})", flush=True)
        return state.global_step

    def save(self, step: int, loader_state: Optional[dict] = None) -> float:
        """`loader_state`: the prompt loader's state to record (None: its current one)."""
        start = time.perf_counter()
        parts = {"actor": self.actor_group.save_checkpoint}
        if self.critic_group is not None:
            parts["critic"] = self.critic_group.save_checkpoint
        state = TrainerState(global_step=step, dataloader=self.train_loader.state_dict() if loader_state is None else loader_state,
                             kl_ctrl={"value": float(self.kl_ctrl.value)},
                             # the run's length, so that resuming a finished run can say so before start-up
                             extra={"total_steps": self.total_steps, "total_epochs": self.run.cfg.trainer.total_epochs,
                                    "total_training_steps": self.run.cfg.trainer.total_training_steps})
        if self.is_rank0:
            self.ckpt.save(step, parts, state)
        else:  # torchrun ranks > 0: the model parts are collective; rank 0 writes the rest
            for name, part in parts.items():
                part(os.path.join(self.ckpt.step_dir(step), name))
        return time.perf_counter() - start

    # ------------------------------------------------------------------ metrics
    def mfu(self, batch: DataProto, timing: dict[str, float], update: dict[str, float]) -> dict[str, float]:
        """perf/mfu/actor over the whole update phase (verl's count); perf/mfu/actor_forward_backward over the
        actor's forward and backward passes alone (`update`'s timing_s/actor_forward_backward), with causal
        attention counted once as megatron_speed.json does."""
        if "update_actor" not in timing or not torch.cuda.is_available():
            return {}
        peak = peak_flops_for(torch.cuda.get_device_name())
        if not peak:
            return {}
        lengths = batch.batch["attention_mask"].sum(-1).float()
        tokens, seq = float(lengths.sum()), float(lengths.mean())
        epochs = self.run.cfg.actor_rollout_ref.actor.ppo_epochs
        gpus = self.run.derived.world_size
        out = {"perf/mfu/actor": compute_mfu(tokens * epochs, timing["update_actor"], gpus, self.hf_config, peak,
                                             seq_len=seq)}
        seconds = update.get("timing_s/actor_forward_backward", 0.0)
        if seconds > 0:
            flops = causal_training_flops(self.hf_config, lengths.tolist()) * epochs
            out["perf/mfu/actor_forward_backward"] = flops / (seconds * gpus * peak)
        return out

    def remax_baselines(self, batch: DataProto, version: int) -> torch.Tensor:
        """ReMax: the greedy response's score for each prompt, broadcast to its samples (`version`: the actor's
        updates so far)."""
        first = {}
        for i, uid in enumerate(batch.non_tensor_batch["uid"]):
            first.setdefault(uid, i)
        prompts = batch[list(first.values())].select(["prompts"], [k for k in batch.non_tensor_batch])
        p = prompts.batch["prompts"]
        pad = self.tokenizer.pad_token_id
        mask = (p != pad).long()
        greedy_in = DataProto.from_dict({"input_ids": p, "attention_mask": mask,
                                         "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                                        dict(prompts.non_tensor_batch), {"greedy": True, "validate": True})
        out = self.generation.generate_sequences(greedy_in, version=version)
        out.meta_info.pop("metrics", None)
        scores = self.sampler.reward_fn(out).reward_tensor.sum(-1)
        by_uid = dict(zip(list(first), scores.tolist()))
        return torch.tensor([by_uid[u] for u in batch.non_tensor_batch["uid"]], dtype=torch.float32)

    def dump_validation(self, out: DataProto, result: RewardOutput, step: int, first: bool) -> None:
        """trainer.validation_data_dir: {step}.jsonl in verl's format; `first` starts the step's file afresh."""
        t = self.run.cfg.trainer
        if self.is_rank0 and t.validation_data_dir:
            records = generation_records(self.tokenizer, out, result.reward_tensor.sum(-1), step,
                                         result.reward_extra_info)
            write_generations(t.validation_data_dir, step, records, append=not first)

    def dump_rollout(self, batch: DataProto, step: int) -> None:
        """trainer.rollout_data_dir: the step's scored training samples, in verl's format."""
        t = self.run.cfg.trainer
        if self.is_rank0 and t.rollout_data_dir:
            extra = {k.split("/", 1)[1]: list(v) for k, v in batch.non_tensor_batch.items()
                     if k.startswith("reward_extra/")}
            records = generation_records(self.tokenizer, batch, batch.batch["token_level_scores"].sum(-1), step, extra)
            write_generations(t.rollout_data_dir, step, records)

    # ------------------------------------------------------------------ end
    def finish(self, final: dict[str, float]) -> None:
        self.progress.close()
        if not self.is_rank0:
            return
        self.tracker.finish()  # the console backend prints the run's summary table
        t = self.run.cfg.trainer
        jsonl = os.path.join(self.tracker.log_dir, "metrics.jsonl")
        if t.plot and os.path.exists(jsonl):
            from .plot import plot_history

            png = os.path.join(self.tracker.log_dir, "training.png")
            plot_history(jsonl, png, title=f"{t.project_name}/{t.experiment_name}")
            print(f"hybridrl: plot written to {png}", flush=True)

    def close(self) -> None:
        self.tracker.finish()
        for g in (self.rollout_group, self.reward_model_group, self.critic_group, self.actor_group):
            if g is not None:
                try:
                    g.shutdown()
                except Exception as e:  # shutting down after a failure must not hide the failure
                    print(f"hybridrl: worker shutdown raised {type(e).__name__}: {e}", flush=True)
        if self.backend == "ray":
            from hybridrl.controller import shutdown_ray

            shutdown_ray()


def advantage_params(algorithm: AlgorithmConfig) -> AdvantageParams:
    """algorithm.* -> the estimators' parameters."""
    return AdvantageParams(gamma=algorithm.gamma, lam=algorithm.lam,
                           norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
                           gdpo_reward_keys=tuple(algorithm.gdpo_reward_keys or ()),
                           gdpo_reward_weights=None if algorithm.gdpo_reward_weights is None
                           else tuple(algorithm.gdpo_reward_weights))


def _actor_weights_read(run: RunConfig) -> bool:
    """Whether any role reads the actor model folder's weights: not when the actor (and the reference, if any)
    start from random weights and the rollout engine from placeholders (load_format=dummy)."""
    ara, d = run.cfg.actor_rollout_ref, run.derived
    return (ara.actor.load_weight or (d.use_reference and ara.ref.load_weight)
            or ara.rollout.load_format != "dummy")


def check_model_fits_layout(run: RunConfig, model_dir: str) -> None:
    """Heads % tp, kv heads % tp, layers % pp: refuse before any worker starts, naming the knob."""
    from hybridrl.config import ConfigError
    from hybridrl.plan.checks import shape_problems
    from hybridrl.plan.model_shape import from_hf_config

    with open(os.path.join(model_dir, "config.json")) as f:
        config = {**json.load(f), **run.cfg.actor_rollout_ref.model.override_config}
    shape = from_hf_config(config, name=os.path.basename(model_dir), source=os.path.join(model_dir, "config.json"))
    problems = shape_problems(run, shape)
    if len(problems) == 1:  # one line, as every user error
        raise ConfigError(f"the model does not fit the parallel layout: {problems[0].message}")
    if problems:
        raise ConfigError("the model does not fit the parallel layout:\n  - " + "\n  - ".join(p.message for p in problems))


def max_rollout_rows(run: RunConfig, n_val: int) -> int:
    """The most sequences one generate call gives a rollout replica: a training batch's samples or a validation
    batch's (n_val prompts, in batches of data.val_batch_size; ReMax's greedy baselines are fewer), split over
    the dp_g replicas."""
    data, d = run.cfg.data, run.derived
    val_batch = min(data.val_batch_size or n_val, n_val)
    train_rows = -(-data.train_batch_size // d.rollout.dp) * d.rollout.n
    val_rows = -(-val_batch // d.rollout.dp) * run.cfg.actor_rollout_ref.rollout.val_kwargs.n
    return max(train_rows, val_rows)


def _model_rewards(run: RunConfig, rule: RewardManager, tokenizer: "PreTrainedTokenizerBase",
                   rm: Optional[tuple[WorkerGroup, str]], generation: Generation) -> RewardFn:
    """The rule reward manager, combined with the reward model and the judge where reward_model.* enables them."""
    from hybridrl.model_rewards.combined import build_combined_reward

    def generate(batch: DataProto) -> DataProto:  # the judge's engine backend: the weights the rollout holds now
        return generation.generate_sequences(batch, version=getattr(generation, "version", None) or 0)

    return build_combined_reward(run, rule, tokenizer, rm_group=rm[0] if rm else None, rm_dir=rm[1] if rm else "",
                                 generate=generate)


def _spawn_groups(run: RunConfig, model_dir: str, total_steps: int, rollout_rows: int,
                  clock: StartupClock) -> tuple[WorkerGroup, Optional[WorkerGroup], Optional[WorkerGroup], bool,
                                                Optional[tuple[WorkerGroup, str]]]:
    """(actor, critic or None, the split placement's rollout group or None, whether this process is rank 0,
    (reward model group, its folder) or None)."""
    from hybridrl.controller import RoleSpec, make_worker_group, spawn_colocated
    from hybridrl.utils.hf_model import materialize_hf_dir
    from hybridrl.workers import ActorRolloutRefWorker, CriticWorker

    cfg, d, t = run.cfg, run.derived, run.cfg.trainer
    roles = {"actor_rollout_ref": RoleSpec(ActorRolloutRefWorker, (run, model_dir, total_steps, rollout_rows))}
    if d.use_critic:
        critic_dir = materialize_hf_dir(cfg.critic.model.path, cfg.critic.model.gguf_file, key="critic.model.path")
        roles["critic"] = RoleSpec(CriticWorker, (run, critic_dir, total_steps))
    rm_dir = ""
    if d.reward.model:
        from hybridrl.workers.reward_model import RewardModelWorker

        rm_dir = materialize_hf_dir(cfg.reward_model.model.path, None, key="reward_model.model.path")
        roles["reward_model"] = RoleSpec(RewardModelWorker, (run, rm_dir))
    use_gpu = d.device == "cuda"
    rollout = None
    if t.backend == "ray":
        from hybridrl.controller import ResourcePool
        from hybridrl.controller.runtime_env import cpus_per_process, joins_cluster

        ray_init = dict(cfg.ray_kwargs.ray_init)
        num_cpus = _init_ray(run)  # Components.build started it beside the data; a no-op then
        joined = joins_cluster(ray_init.get("address"))
        processes = d.world_size + d.placement.rollout_world
        per_process = 1.0 if use_gpu else cpus_per_process(num_cpus, processes, t.n_gpus_per_node, joined)
        pool = ResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=use_gpu, num_cpus_per_process=per_process)
        groups = spawn_colocated(pool, roles, backend="ray", call_timeout_s=t.worker_timeout_s,
                                 dist_timeout_s=t.dist_timeout_s)
        if d.placement.split:
            from hybridrl.workers import RolloutWorker

            p = d.placement
            rollout_pool = ResourcePool([p.rollout_gpus_per_node] * p.rollout_nnodes, use_gpu=use_gpu,
                                        num_cpus_per_process=per_process, name="rollout")
            rollout = make_worker_group("ray", RolloutWorker, (run, model_dir, rollout_rows), role="rollout",
                                        resource_pool=rollout_pool, call_timeout_s=t.worker_timeout_s,
                                        dist_timeout_s=t.dist_timeout_s)
        rank0 = True
    else:
        groups = spawn_colocated(None, roles, backend="local", call_timeout_s=t.worker_timeout_s,
                                 dist_timeout_s=t.dist_timeout_s, use_gpu=use_gpu)
        rank0 = int(os.environ.get("RANK", "0")) == 0
    actor = groups["actor_rollout_ref"]
    clock.lap("workers")
    rollout_init = rollout.execute_all_async("init_model") if rollout is not None else None  # beside the actor's
    clock.add_worker(actor.init_model()[0].get("startup", {}))
    if rollout_init is not None:
        rollout_init.get()
        clock.lap("rollout_build")  # what the rollout's build took beyond the actor's
    critic = groups.get("critic")
    if critic is not None:
        critic.init_model()
        clock.lap("critic_build")
    reward_model = groups.get("reward_model")
    if reward_model is not None:
        reward_model.init_model()
        clock.lap("reward_model_build")
    return actor, critic, rollout, rank0, (reward_model, rm_dir) if reward_model is not None else None


def _init_ray(run: RunConfig) -> int:
    """Start (or join) Ray as ray_kwargs asks, unless this process already did; returns the CPUs it was given."""
    from hybridrl.controller import init_ray

    cfg, d = run.cfg, run.derived
    ray_init = dict(cfg.ray_kwargs.ray_init)
    num_cpus = ray_init.pop("num_cpus", None) or max(os.cpu_count() or 1, d.world_size + d.placement.rollout_world)
    init_ray(num_cpus=num_cpus, connect_timeout_s=cfg.ray_kwargs.connect_timeout_s,
             **{k: v for k, v in ray_init.items() if v is not None})
    return num_cpus


def _startup_report(run: RunConfig, model_dir: str, n_train: int, n_val: int, train: Any, total: int) -> str:
    filtered = getattr(train, "num_filtered_overlong", 0)
    lines = [f"hybridrl: model {model_dir}", run.summary(),
             f"data: {n_train} train prompts ({filtered} filtered as overlong), {n_val} validation prompts; "
             f"{total} steps"]
    return "\n".join(lines)
