"""`python -m hybridrl.trainer.main_ppo [--config-name NAME] [--cfg job] key=value ...` (verl's command line)."""
from __future__ import annotations

import sys

from hybridrl.config.cli import load_run


def main(argv: list[str] | None = None) -> None:
    _, run = load_run(sys.argv[1:] if argv is None else argv)
    from hybridrl.trainer.ppo_trainer import run_ppo  # heavy imports only once the config is valid

    run_ppo(run)


if __name__ == "__main__":
    main()
