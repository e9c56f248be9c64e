"""The PPO/GRPO loop. `fit` and `train_step` read as the algorithm; everything they call is named.

One step:  prompts -> rollout (hybrid engine: sync weights, generate, sleep) -> reward
           [-> DAPO's dynamic sampling: more prompts until enough groups with signal (dynamic_sampling.py)]
           -> old log-probs (actor; bypass_mode: the rollout's) -> ref log-probs -> values (critic)
           -> KL in reward, rollout correction, advantages
           -> critic update (after critic_warmup) -> actor update -> validation / checkpoint / metrics

The rollout and reward part comes from the stream `rollout_stream` builds (synchronous, one step off, or fully
async); every stream generates and scores through the one Sampler (sampling.py) and never calls back into the trainer.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Iterator, Optional

from hybridrl.config import RunConfig
from hybridrl.config.preflight import check_inputs
from hybridrl.hybrid.checks import logprob_gap, routing_agreement
from hybridrl.plan.device_check import check_memory
from hybridrl.protocol import DataProto
from hybridrl.utils import logs
from hybridrl.utils.timing import timed

from . import batch_ops as ops
from .components import Components
from .dynamic_sampling import Rollout, RolloutStream
from .fully_async import FullyAsyncStream
from .generation import SplitGeneration
from .metrics import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics
from .one_step_off import OneStepOffStream
from .profiling import StepProfile
from .run_folder import check_run_folder, clear_earlier_run
from .spilled import Carried, SpillLedger, carry
from .stopping import RunStopped, StopSignals

ACTOR_HEALTH = ("actor/pg_loss", "actor/grad_norm")
CRITIC_HEALTH = ("critic/vf_loss", "critic/grad_norm")


class NonFiniteError(RuntimeError):
    """A loss or gradient norm went NaN/Inf (trainer.on_nonfinite=error): the step is not checkpointed."""


class PPOTrainer:
    def __init__(self, run: RunConfig, parts: Components, signals: Optional[StopSignals] = None) -> None:
        self.cfg, self.derived = run.cfg, run.derived
        self.parts = parts  # everything built from the config: data, workers, tracker, checkpoints (components.py)
        self.signals = signals
        self.actor, self.critic, self.sampler = parts.actor_group, parts.critic_group, parts.sampler
        self.global_step = 0  # actor updates done: the version of the weights the next generation starts from
        self.first_val: dict[str, float] = {}
        self.last_val: dict[str, float] = {}
        groups = [parts.actor_group, parts.critic_group, parts.rollout_group, parts.reward_model_group]
        self.profile = StepProfile.from_run(run, groups)  # global_profiler: None when off
        self.carried: Optional[Carried] = None  # fully async, resumed: the spilled groups to train first

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        t = self.cfg.trainer
        self.resume_and_validate_first()
        if t.val_only:
            return self.last_val
        startup = self.parts.startup.done()  # what the user waited for, logged with the first step
        if self.parts.is_rank0:
            print(self.parts.startup.summary(), flush=True)
        if self.signals is not None:
            self.signals.training = True  # from here a signal lets the step in flight finish and be saved
        rollouts, began = self.rollout_stream(), time.perf_counter()
        self.profile_window(open_step=self.global_step + 1)
        for rollout in rollouts:  # generated and scored, on the weights of the updates so far (or one behind)
            self.global_step += 1
            metrics = {**self.train_step(rollout, self.global_step), **startup}
            metrics.update(self.profile_window(close_step=self.global_step))
            startup = {}
            out_of_time = t.max_time_s is not None and time.perf_counter() - began > t.max_time_s
            last = self.global_step == self.parts.total_steps or out_of_time
            stopping = self.signals is not None and self.signals.agreed()  # a signal came: save, skip validation
            if t.test_freq > 0 and not stopping and (self.global_step % t.test_freq == 0 or last):
                self.last_val = self.validate()
                self.first_val = self.first_val or self.last_val
                metrics.update(self.last_val)
            if t.save_freq > 0 and (self.global_step % t.save_freq == 0 or last or stopping):
                metrics["timing_s/save_checkpoint"] = self.parts.save(self.global_step, rollouts.loader_state())
            self.parts.tracker.log(metrics, self.global_step)
            self.parts.progress.update(self.global_step, metrics)
            if stopping:
                self.stopped_by_signal(t.save_freq > 0)
                break
            if out_of_time:
                print(f"hybridrl: trainer.max_time_s={t.max_time_s} reached after step {self.global_step}", flush=True)
                break
            self.profile_window(open_step=self.global_step + 1)
        return self.last_val

    def profile_window(self, open_step: int = 0, close_step: int = 0) -> dict[str, float]:
        """global_profiler: open the window before a chosen step's rollout is drawn, close it after its update."""
        if self.profile is None:
            return {}
        if close_step:
            return self.profile.close(close_step)
        self.profile.open(open_step)
        return {}

    def resume_and_validate_first(self) -> None:
        """Resume from the latest checkpoint (trainer.resume_mode) and validate before training where asked."""
        self.global_step = self.parts.resume()
        if self.global_step:
            self.parts.startup.lap("resume")
            self.carried = self.read_spilled()  # before validation: a damaged file stops the run at once
        t = self.cfg.trainer
        if t.val_before_train or t.val_only:
            self.first_val = self.last_val = self.validate()
            self.parts.tracker.log(self.last_val, self.global_step)
            self.parts.startup.lap("val_before_train")

    def rollout_stream(self) -> RolloutStream | OneStepOffStream | FullyAsyncStream:
        """One generated and scored batch per remaining step: generated for the step and filtered by DAPO's dynamic
        sampling where it is on (dynamic_sampling.py); one step ahead with trainer.one_step_off_policy
        (one_step_off.py); taken from the continuously fed queue with async_training.enable (fully_async.py)."""
        parts, placement, start = self.parts, self.derived.placement, self.global_step
        prompts, steps = parts.prompt_batches(), max(parts.total_steps - start, 0)
        if placement.fully_async:
            assert isinstance(parts.generation, SplitGeneration), "fully async runs on rollout workers of their own"
            return FullyAsyncStream(prompts, parts.generation, self.sampler, placement.fully_async, start_step=start,
                                    steps=steps, spill_dir=self.spill_dir(), call_timeout_s=self.cfg.trainer.worker_timeout_s,
                                    snapshot=parts.train_loader.state_dict, carried=self.carried)
        if placement.one_step_off:
            return OneStepOffStream(prompts, self.sampler, start_step=start, steps=steps,
                                    snapshot=parts.train_loader.state_dict)
        fg = self.cfg.algorithm.filter_groups
        return RolloutStream(prompts, self.sampler, start_step=start, steps=steps,
                             train_batch_size=self.cfg.data.train_batch_size,
                             filter_metric=fg.metric if fg.enable else None, max_num_gen_batches=fg.max_num_gen_batches)

    def spill_dir(self) -> str:
        return os.path.join(os.path.expanduser(self.cfg.trainer.default_local_dir),
                            self.cfg.async_training.queue_samples_dir)

    def read_spilled(self) -> Optional[Carried]:
        """Fully async: the finished groups this run wrote to its spill folder before the checkpoint resumed from
        was superseded, and not consumed by then (spilled.py); None in the other modes."""
        plan = self.derived.placement.fully_async
        if not plan:
            return None
        loader = self.parts.train_loader.state_dict()
        ledger = SpillLedger.from_loader_state(self.parts.resumed_loader_state)
        carried = carry(self.spill_dir(), ledger, (loader["epoch"], loader["position"]), self.global_step)
        for line in carried.report(self.spill_dir(), self.global_step, plan.max_lag):
            print(f"hybridrl: fully async resume: {line}", flush=True)
        return carried

    def stopped_by_signal(self, saved: bool) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)  # the step is saved: the rest of the shut-down may take its time
        where = (f"saved it to {self.parts.ckpt.step_dir(self.global_step)} (trainer.resume_mode=auto continues)"
                 if saved else "nothing saved (trainer.save_freq=-1)")
        if self.parts.is_rank0:
            print(f"hybridrl: stopped by {self.signals.name} after step {self.global_step}; {where}", flush=True)

    def train_step(self, rollout: Rollout, step: int) -> dict[str, float]:
        timing = dict(rollout.timing)
        metrics: dict[str, float] = {"training/global_step": step, "training/epoch": rollout.epoch, **rollout.metrics,
                                     **rollout.batch.meta_info.pop("reward_metrics", {})}  # reward model, judge
        with timed(timing, "step"):
            batch = self.balance(rollout.batch, metrics)
            with timed(timing, "old_log_prob"):
                batch = self.old_log_probs(batch, metrics)
            if self.derived.use_reference:
                with timed(timing, "ref"):
                    ref = self.actor.compute_ref_log_prob(batch)
                    metrics.update(ref.meta_info.pop("metrics", {}))
                    batch = batch.union(ref)
            if self.derived.use_critic:
                with timed(timing, "values"):
                    batch = batch.union(self.critic.compute_values(batch))
            with timed(timing, "adv"):
                batch = self.advantages(batch, metrics)
            self.parts.dump_rollout(batch, step)
            if self.derived.use_critic:
                with timed(timing, "update_critic"):
                    metrics.update(self.checked(self.critic.update_critic(batch), CRITIC_HEALTH, step))
            if step > self.cfg.trainer.critic_warmup:
                with timed(timing, "update_actor"):
                    metrics.update(self.checked(self.actor.update_actor(batch), ACTOR_HEALTH, step))
        timing["step"] += sum(rollout.timing.values())  # gen, reward (+ launch_gen one step ahead)
        metrics.update(self.step_metrics(batch, timing, metrics))
        return metrics

    def step_metrics(self, batch: DataProto, timing: dict[str, float], update: dict[str, float]) -> dict[str, float]:
        """Data (scores, advantages, lengths), timing, throughput and MFU of the step just trained."""
        gpus = self.derived.world_size + self.derived.placement.rollout_world
        return {**compute_data_metrics(batch, self.derived.use_critic), **compute_timing_metrics(batch, timing),
                **compute_throughput_metrics(batch, timing, gpus), **self.parts.mfu(batch, timing, update)}

    # ------------------------------------------------------------------ steps
    def old_log_probs(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        if self.derived.algorithm.bypass_mode:
            return ops.rollout_log_probs_as_old(batch)
        batch.meta_info["calculate_sum_pi_squared"] = self.derived.algorithm.sum_pi_squared
        batch = batch.union(self.actor.compute_log_prob(batch))
        metrics.update(logprob_gap(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"],
                                   batch.batch["response_mask"]))
        metrics.update(routing_agreement(batch.batch))  # MoE: rollout's experts vs the actor's
        return batch

    def balance(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        if not self.cfg.trainer.balance_batch:
            return batch
        batch, m = ops.balance_batch(batch, self.derived.actor.dp, self.cfg.trainer.balance_batch_sort)
        metrics.update(m)
        return batch

    def advantages(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        a = self.cfg.algorithm
        batch, kl_metrics = ops.rewards_with_kl(batch, a.use_kl_in_reward, self.parts.kl_ctrl, a.kl_penalty)
        metrics.update(kl_metrics)
        if self.parts.rollout_correction is not None and not self.derived.algorithm.bypass_mode:
            batch, rc_metrics = ops.with_rollout_correction(batch, self.parts.rollout_correction)
            metrics.update(rc_metrics)
        baselines = self.parts.remax_baselines(batch, self.global_step - 1) if a.adv_estimator == "remax" else None
        return ops.advantages(batch, a.adv_estimator, self.parts.adv_params, baselines)

    def checked(self, out: DataProto, keys: tuple[str, ...], step: int) -> dict[str, float]:
        metrics = dict(out.meta_info["metrics"])
        bad = ops.first_nonfinite(metrics, keys)
        if bad is not None:
            if self.cfg.trainer.on_nonfinite == "error":
                raise NonFiniteError(f"step {step}: {bad}={metrics[bad]}; the update is not checkpointed. "
                                     "Lower the learning rate or check the data; trainer.on_nonfinite=skip skips such steps")
            metrics["training/nonfinite_skipped"] = 1.0
        return metrics

    def validate(self) -> dict[str, float]:
        sources, scores, lengths, tool_calls, turns = [], [], [], [], []
        extras: dict[str, list] = {}
        n = self.cfg.actor_rollout_ref.rollout.val_kwargs.n
        for i, prompts in enumerate(self.parts.val_batches()):
            prompts.meta_info.update(step=self.global_step, validate=True)
            out = self.parts.generation.generate_sequences(prompts, version=self.global_step)
            out.meta_info.pop("metrics", None)
            result = self.parts.val_reward_fn(out)
            scores += result.reward_tensor.sum(-1).tolist()
            sources += list(out.non_tensor_batch[self.cfg.data.reward_fn_key])
            lengths += out.batch["response_mask"].sum(-1).tolist()
            tool_calls += list(out.non_tensor_batch.get("agent_tool_calls", []))
            turns += list(out.non_tensor_batch.get("agent_turns", []))
            for key, values in result.reward_extra_info.items():
                extras.setdefault(key, []).extend(values)
            self.parts.dump_validation(out, result, self.global_step, first=i == 0)
        return {**ops.validation_metrics(sources, scores, n, lengths, extras),
                **ops.agent_metrics(tool_calls, turns, prefix="val/agent")}


@contextlib.contextmanager
def warnings_to_log_file(trainer_cfg: Any) -> Iterator[None]:
    """Other packages' warnings of this run (driver and workers) go to {default_local_dir}/logs/warnings.log."""
    folder = os.path.join(os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir)), "logs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "warnings.log")
    saved = os.environ.get(logs.WARNINGS_ENV)
    os.environ[logs.WARNINGS_ENV] = path  # the workers' logs.setup() reads it (forwarded like HYBRIDRL_LOG_LEVEL)
    logs.route_warnings(path)
    print(f"hybridrl: other packages' warnings go to {path}", flush=True)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(logs.WARNINGS_ENV, None)
        else:
            os.environ[logs.WARNINGS_ENV] = saved


def build_components(run: RunConfig, signals: Optional[StopSignals]) -> Components:
    """Components.build, during which ray.init installs its own SIGTERM handler (sys.exit(15)): a SIGTERM there
    becomes RunStopped like any other signal during start-up, and ours is put back afterwards."""
    try:
        parts = Components.build(run)
    except SystemExit as e:
        if signals is not None and e.code == signal.SIGTERM:
            raise RunStopped(signal.SIGTERM, "before training started") from None
        raise
    if signals is not None:
        signals.install()
        try:
            signals.raise_if_requested()
        except RunStopped:
            parts.close()
            raise
    return parts


def run_ppo(run: RunConfig) -> dict[str, Any]:
    """Build everything from the validated config, train, and shut down cleanly (also on errors).
    Returns the first and the last validation metrics ({"before": ..., "after": ...}; "stopped_by": the signal
    that stopped it after a saved step, or None); {"finished": message}
    without starting anything when trainer.default_local_dir holds this run already finished (run_folder.py)."""
    logs.setup()
    done = check_run_folder(run.cfg.trainer)
    if done:  # nothing to train: the inputs need no checking either
        print(done, flush=True)
        return {"before": {}, "after": {}, "steps": 0, "finished": done}
    check_inputs(run)  # model, tokenizer, data and reward files: seconds, before Ray and the workers start
    check_memory(run)  # the memory plan against this machine's GPUs (trainer.memory_check)
    clear_earlier_run(run.cfg.trainer, rank=int(os.environ.get("RANK", "0")))  # only once all of that passed
    # SIGTERM/SIGINT: stop after the step and save it (stopping.py); under torchrun the ranks agree on the step
    signals = StopSignals(run.cfg.trainer.stop_grace_s, ranks=run.cfg.trainer.backend == "local")
    with signals, warnings_to_log_file(run.cfg.trainer):
        parts = build_components(run, signals)
        try:
            trainer = PPOTrainer(run, parts, signals)
            final = trainer.fit()
            parts.finish(final)
            return {"before": trainer.first_val, "after": final, "steps": trainer.global_step,
                    "stopped_by": signals.signum}
        finally:
            parts.close()
