"""`python -m hybridrl.trainer.main_ppo [--config-name NAME] [--cfg job] key=value ...` (verl's command line)."""
from __future__ import annotations

import sys

from hybridrl.config.cli import load_run, normalize_argv, user_errors


def main(argv: list[str] | None = None) -> None:
    _, run = load_run(normalize_argv(sys.argv[1:] if argv is None else argv))
    from hybridrl.data.readers import DataFileError
    from hybridrl.trainer.checkpoint_manager import CheckpointError
    from hybridrl.trainer.ppo_trainer import run_ppo  # heavy imports only once the config is valid
    from hybridrl.trainer.stopping import exit_when_stopped

    with user_errors(also=(CheckpointError, DataFileError)), exit_when_stopped(run.cfg.trainer):
        result = run_ppo(run)
    if result.get("stopped_by"):  # stopped and saved after a signal: not finished, as the shell's status says
        raise SystemExit(128 + result["stopped_by"])


if __name__ == "__main__":
    main()
