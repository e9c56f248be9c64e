"""`python -m hybridrl.trainer.main_sft key=value ...` (or `torchrun --nproc_per_node=N -m hybridrl.trainer.main_sft`):
supervised fine-tuning with verl's SFT trainer keys on the Megatron engine RL uses.

    torchrun --nproc_per_node=8 -m hybridrl.trainer.main_sft \\
        data.train_files=traces/train.parquet data.val_files=traces/test.parquet data.messages_key=messages \\
        data.max_length=1024 data.train_batch_size=64 data.micro_batch_size_per_gpu=4 \\
        model.path=~/models/SmolLM2-135M-Instruct optim.lr=1e-5 engine.tensor_model_parallel_size=2 \\
        trainer.total_epochs=2 trainer.default_local_dir=ckpt/sft
    python -m hybridrl.trainer.main_ppo actor_rollout_ref.model.path=ckpt/sft/global_step_N/huggingface ...

`--cfg job` prints the resolved config and the derived sizes, then exits. verl's Hydra group choices
`engine=megatron` and `optim=megatron` are accepted (Megatron is the only engine here).
"""
from __future__ import annotations

import sys
from typing import Optional

from hybridrl.config.cli import parse_command_line, user_errors
from hybridrl.config.loader import ConfigError, load_config, to_yaml
from hybridrl.config.schema.sft import SFTConfig
from hybridrl.config.sft_validate import SFTRun, validate_sft

GROUP_CHOICES = {"engine": "megatron", "optim": "megatron", "model": "hf_model"}


def without_group_choices(overrides: list[str]) -> list[str]:
    """verl's `engine=megatron`-style Hydra group picks: the Megatron ones are what runs here; others are refused."""
    out = []
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key in GROUP_CHOICES and "." not in key:
            if value != GROUP_CHOICES[key]:
                raise ConfigError(f"{key}={value}: hybridrl trains with the Megatron engine; use {key}="
                                  f"{GROUP_CHOICES[key]} (or leave it out) and set its keys as {key}.NAME=VALUE")
            continue
        out.append(o)
    return out


def load_sft_run(argv: list[str]) -> SFTRun:
    """Parse, compose and validate; a config mistake is printed (naming the key) and exits 2."""
    cl = parse_command_line(argv, default_config=None)
    try:
        cfg = load_config(without_group_choices(cl.overrides), cl.config_name, cl.config_path, schema=SFTConfig)
        if cl.cfg_mode:
            sys.stdout.write(to_yaml(cfg))
        run = validate_sft(cfg)
    except ConfigError as e:
        print(f"hybridrl sft: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if cl.cfg_mode:
        print("# derived:\n# " + run.summary().replace("\n", "\n# "), file=sys.stderr)
        raise SystemExit(0)
    return run


def main(argv: Optional[list[str]] = None) -> dict:
    run = load_sft_run(sys.argv[1:] if argv is None else argv)
    from hybridrl.trainer.stopping import StopSignals, exit_when_stopped

    t = run.cfg.trainer
    with StopSignals(t.stop_grace_s, ranks=t.backend == "local") as signals, exit_when_stopped(t):
        # installed before the heavy imports: a signal during them stops the run when start-up ends
        from hybridrl.data.readers import DataFileError
        from hybridrl.trainer.checkpoint_manager import CheckpointError
        from hybridrl.trainer.sft_trainer import run_sft  # heavy imports only once the config is valid

        with user_errors("hybridrl sft", also=(CheckpointError, DataFileError, FileNotFoundError)):
            result = run_sft(run, signals)
    if result.get("stopped_by"):  # stopped and saved after a signal: not finished, as the shell's status says
        raise SystemExit(128 + result["stopped_by"])
    return result


if __name__ == "__main__":
    main()
