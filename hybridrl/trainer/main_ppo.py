"""`python -m hybridrl.trainer.main_ppo [--config-name NAME] [--cfg job] key=value ...` (verl's command line)."""
from __future__ import annotations

import os
import sys

from hybridrl.config.cli import load_run, user_errors


def normalize_argv(argv: list[str]) -> list[str]:
    """`hybridrl train --config FILE --preset NAME` spelled as main_ppo arguments."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--preset" or a.startswith("--preset="):
            out.append("preset=" + (a.split("=", 1)[1] if "=" in a else next(it)))
        elif a == "--config" or a.startswith("--config="):
            path = a.split("=", 1)[1] if "=" in a else next(it)
            out += ["--config-path", os.path.dirname(os.path.abspath(path)), "--config-name", os.path.basename(path)]
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> None:
    _, run = load_run(normalize_argv(sys.argv[1:] if argv is None else argv))
    from hybridrl.data.readers import DataFileError
    from hybridrl.trainer.checkpoint_manager import CheckpointError
    from hybridrl.trainer.ppo_trainer import run_ppo  # heavy imports only once the config is valid

    with user_errors(also=(CheckpointError, DataFileError)):
        run_ppo(run)


if __name__ == "__main__":
    main()
