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
            out.append("preset=" + _value(a, it, "--preset NAME (a file of configs/parallel/, e.g. 7b_8gpu)"))
        elif a == "--config" or a.startswith("--config="):
            path = _value(a, it, "--config FILE (a YAML config)")
            out += ["--config-path", os.path.dirname(os.path.abspath(path)), "--config-name", os.path.basename(path)]
        else:
            out.append(a)
    return out


def _value(arg: str, rest, wanted: str) -> str:
    """The value of `--flag=V` or `--flag V`; a missing one exits 2 saying what to give."""
    value = arg.split("=", 1)[1] if "=" in arg else next(rest, None)
    if not value or value.startswith("-") or "=" in value and "=" not in arg:
        print(f"hybridrl: {arg.split('=')[0]} needs a value: {wanted}", file=sys.stderr)
        raise SystemExit(2)
    return value


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
