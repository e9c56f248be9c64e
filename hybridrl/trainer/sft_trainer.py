"""The SFT loop on the Megatron engine: batches -> one optimizer step each -> val/loss -> checkpoint.

    step:  batch of conversations (SFTDataset, RL's batch layout) -> SFTWorker.train_batch (masked NLL)
           [-> val/loss over data.val_files] [-> save: actor/ (RL's checkpoint format) + huggingface/]

A saved step is RL's checkpoint layout (checkpoint_manager.py: the commit protocol, `.complete`, the marker):
global_step_N/actor is the same Megatron checkpoint an RL actor writes (model_merger converts it), and
global_step_N/huggingface is the model as an HF folder (safetensors, config, tokenizer), which
`main_ppo actor_rollout_ref.model.path=.../global_step_N/huggingface` reads as it is, as verl users pass the HF
folder of their SFT checkpoint. The last step is always saved.
"""
from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any, Iterator, Optional

from hybridrl.config.loader import to_dict
from hybridrl.config.sft_validate import SFTRun
from hybridrl.utils import logs

from .checkpoint_manager import CheckpointManager, TrainerState, find_resume_path, load_trainer_state, restore_rng_state
from .run_folder import check_run_folder, clear_earlier_run
from .stopping import RunStopped, StopSignals
from .tracking import Tracker

HF_PART = "huggingface"


class SFTTrainer:
    def __init__(self, run: SFTRun) -> None:
        from hybridrl.data.loader import PromptLoader
        from hybridrl.data.sft_dataset import collate_sft, create_sft_dataset
        from hybridrl.data.tokenizer import load_tokenizer
        from hybridrl.utils.hf_model import materialize_hf_dir

        self.run, cfg = run, run.cfg
        t, d = cfg.trainer, cfg.data
        self.model_dir = materialize_hf_dir(run.derived.model_path, cfg.model.gguf_file, key="model.path")
        self.tokenizer_dir = cfg.model.tokenizer_path or d.tokenizer or self.model_dir
        self.tokenizer = load_tokenizer(self.tokenizer_dir, trust_remote_code=cfg.model.trust_remote_code)
        collate = functools.partial(collate_sft, pad_token_id=self.tokenizer.pad_token_id)
        train = create_sft_dataset(d.train_files, d, self.tokenizer, d.train_max_samples)
        self.loader = PromptLoader(train, d.train_batch_size, shuffle=d.shuffle, seed=t.seed if d.seed is None else d.seed,
                                   drop_last=True, collate_fn=collate)
        self.val_loader = None
        if d.val_files:
            val = create_sft_dataset(d.val_files, d, self.tokenizer, d.val_max_samples)
            self.val_loader = PromptLoader(val, d.train_batch_size, shuffle=False, drop_last=False, collate_fn=collate)
        self.total_steps = t.total_training_steps or len(self.loader) * t.total_epochs
        self.rank0 = t.backend == "ray" or int(os.environ.get("RANK", "0")) == 0
        self.root = os.path.abspath(os.path.expanduser(t.default_local_dir))
        self.ckpt = CheckpointManager(self.root, to_dict(cfg), keep_actor=t.max_ckpt_to_keep)
        self.tracker = Tracker(t.logger if self.rank0 else [], t.project_name, t.experiment_name, to_dict(cfg),
                               os.path.join(self.root, "logs"))
        if self.rank0:
            print(f"hybridrl sft: model {self.model_dir}\n{run.summary()}\ndata: {len(train)} train "
                  f"{'conversations' if getattr(train, 'multiturn', False) else 'rows'}, "
                  f"{len(self.val_loader.dataset) if self.val_loader else 0} validation; {self.total_steps} steps",
                  flush=True)
        self.group = spawn_sft_group(run, self.model_dir, self.total_steps, self.tokenizer_dir)
        self.global_step = 0

    # ------------------------------------------------------------------ the loop
    def fit(self, signals: Optional[StopSignals] = None) -> dict[str, Any]:
        """`signals`: SIGTERM/SIGINT stop the run after the step in flight, saved (stopping.py)."""
        self.global_step = self.resume()
        t = self.run.cfg.trainer
        first: dict[str, float] = {}
        metrics: dict[str, float] = {}
        if signals is not None:
            signals.training = True
        for batch in self.batches():
            self.global_step += 1
            start = time.perf_counter()
            metrics = dict(self.group.train_batch(batch).meta_info["metrics"])
            metrics.update({"training/global_step": self.global_step, "training/epoch": batch.meta_info["epoch"],
                            "timing_s/step": time.perf_counter() - start})
            first = first or dict(metrics)
            last = self.global_step == self.total_steps
            stopping = signals is not None and signals.agreed()  # under torchrun: every rank, the same answer
            if self.val_loader is not None and not stopping and (
                    last or t.test_freq > 0 and self.global_step % t.test_freq == 0):
                metrics["val/loss"] = self.validate()
            if last or stopping or t.save_freq > 0 and self.global_step % t.save_freq == 0:
                metrics["timing_s/save_checkpoint"] = self.save(self.global_step)
            self.tracker.log(metrics, self.global_step)
            if stopping:
                signal.setitimer(signal.ITIMER_REAL, 0)  # saved: the rest of the shut-down may take its time
                if self.rank0:
                    print(f"hybridrl: stopped by {signals.name} after step {self.global_step}; saved it to "
                          f"{self.ckpt.step_dir(self.global_step)} (trainer.resume_mode=auto continues)", flush=True)
                break
            if last:
                break
        return {"first": first, "last": metrics, "steps": self.global_step,
                "hf_dir": os.path.join(self.ckpt.step_dir(self.global_step), HF_PART),
                "stopped_by": signals.signum if signals is not None and signals.requested else None}

    def batches(self) -> Iterator[Any]:
        """Training batches from where the loader stands, epochs rolling over, until the last step."""
        while self.global_step < self.total_steps:
            yield from self.loader

    def validate(self) -> float:
        nll = tokens = 0.0
        self.val_loader.position = 0
        for batch in self.val_loader:
            out = self.group.nll_per_row(batch)
            nll += float(out.batch["nll"].sum())
            tokens += float(out.batch["tokens"].sum())
        return nll / max(tokens, 1.0)

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int) -> float:
        start = time.perf_counter()
        parts = {"actor": self.group.save_checkpoint}
        if self.run.cfg.trainer.export_hf:
            parts[HF_PART] = self.group.save_hf
        state = TrainerState(global_step=step, dataloader=self.loader.state_dict(),
                             extra={"total_steps": self.total_steps, "total_epochs": self.run.cfg.trainer.total_epochs,
                                    "total_training_steps": self.run.cfg.trainer.total_training_steps})
        if self.rank0:
            self.ckpt.save(step, parts, state)
            self._prune_exports()
        else:  # torchrun ranks > 0: the parts are collective; rank 0 writes the rest
            for name, part in parts.items():
                part(os.path.join(self.ckpt.step_dir(step), name))
        return time.perf_counter() - start

    def _prune_exports(self) -> None:
        """trainer.max_ckpt_to_keep: the manager drops older actor/ parts; their HF exports go with them."""
        import shutil

        from .checkpoint_manager import is_pruned, step_dirs

        for folder in step_dirs(self.root).values():
            if is_pruned(folder) and os.path.isdir(os.path.join(folder, HF_PART)):
                shutil.rmtree(os.path.join(folder, HF_PART))

    def resume(self) -> int:
        path = find_resume_path(self.run.cfg.trainer)
        if path is None:
            return 0
        state = load_trainer_state(path)
        self.group.load_checkpoint(os.path.join(path, "actor"))
        self.loader.load_state_dict(state.dataloader)
        restore_rng_state(state.rng)
        if self.rank0:
            print(f"hybridrl sft: resumed from {path} (step {state.global_step})", flush=True)
        return state.global_step

    def close(self) -> None:
        self.tracker.finish()
        self.group.shutdown()
        if self.run.cfg.trainer.backend == "ray":
            from hybridrl.controller import shutdown_ray

            shutdown_ray()


def spawn_sft_group(run: SFTRun, model_dir: str, total_steps: int, tokenizer_dir: Optional[str]) -> Any:
    """The SFT workers on the configured backend (torchrun ranks, or Ray actors), models built."""
    from hybridrl.controller import make_worker_group
    from hybridrl.workers.sft import SFTWorker

    t, use_gpu = run.cfg.trainer, run.derived.device == "cuda"
    pool = None
    if t.backend == "ray":
        from hybridrl.controller import ResourcePool, init_ray

        ray_init = dict(run.cfg.ray_kwargs.get("ray_init") or {})
        num_cpus = ray_init.pop("num_cpus", None) or max(os.cpu_count() or 1, run.derived.world_size)
        init_ray(num_cpus=num_cpus, connect_timeout_s=float(run.cfg.ray_kwargs.get("connect_timeout_s", 30.0)),
                 **{k: v for k, v in ray_init.items() if v is not None})
        per_process = 1.0 if use_gpu else min(1.0, num_cpus / run.derived.world_size)
        pool = ResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=use_gpu, num_cpus_per_process=per_process)
    group = make_worker_group(t.backend, SFTWorker, (run, model_dir, total_steps, tokenizer_dir), role="sft",
                              resource_pool=pool, call_timeout_s=t.worker_timeout_s, dist_timeout_s=t.dist_timeout_s,
                              use_gpu=use_gpu)
    group.init_model()
    return group


def run_sft(run: SFTRun, signals: Optional[StopSignals] = None) -> dict[str, Any]:
    """Train from the validated config and shut down cleanly (also on errors). {"finished": message} without
    starting anything when trainer.default_local_dir holds this run already finished. `signals` (main_sft installs
    them): a signal stops the run after the step in flight and saves it ("stopped_by": the signal), or, during
    start-up, once start-up ends (RunStopped)."""
    logs.setup()
    done = check_run_folder(run.cfg.trainer)
    if done:
        print(done, flush=True)
        return {"finished": done, "steps": 0}
    clear_earlier_run(run.cfg.trainer, rank=int(os.environ.get("RANK", "0")))
    try:
        trainer = SFTTrainer(run)
    except SystemExit as e:  # ray.init's own SIGTERM handler (trainer.backend=ray) exits during start-up
        if signals is not None and e.code == signal.SIGTERM:
            raise RunStopped(signal.SIGTERM, "before training started") from None
        raise
    try:
        if signals is not None:
            signals.install()  # again: ray.init replaced the SIGTERM handler
            signals.raise_if_requested()  # under torchrun the ranks agree first
        result = trainer.fit(signals)
    finally:
        trainer.close()
    if result["stopped_by"]:
        return result
    if trainer.rank0:
        first, last = result["first"], result["last"]
        print(f"hybridrl sft: {result['steps']} steps, train/loss {first.get('train/loss', float('nan')):.4f} -> "
              f"{last.get('train/loss', float('nan')):.4f}"
              + (f", val/loss {last['val/loss']:.4f}" if "val/loss" in last else ""), flush=True)
        if run.cfg.trainer.export_hf:
            print(f"hybridrl sft: the model is in {result['hf_dir']}; start RL from it with "
                  f"actor_rollout_ref.model.path={result['hf_dir']}", flush=True)
    return result
