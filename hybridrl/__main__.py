"""`hybridrl SUBCOMMAND ...` (also `python -m hybridrl SUBCOMMAND ...`).

Each subcommand lives in its own module with a `main(argv: list[str]) -> int | None`; this file only
dispatches, so adding one is a line in SUBCOMMANDS.
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "train": ("hybridrl.trainer.main_ppo", "run PPO/GRPO (verl's main_ppo command line; --preset NAME, --config FILE)"),
    "plan": ("hybridrl.plan.cli", "print the derived layout and a per-GPU memory plan for a config"),
    "convert": ("hybridrl.model_merger.convert_cli", "hf-to-mcore | mcore-to-hf checkpoint conversion"),
    "generate": ("hybridrl.trainer.main_generation", "n samples per prompt to parquet"),
    "eval": ("hybridrl.trainer.main_eval", "mean score and pass@k per data_source"),
    "torchrun": ("hybridrl.torchrun", "torchrun's arguments; ends on SIGTERM/SIGINT without torchrun's own traceback"),
}


def usage() -> str:
    lines = ["usage: hybridrl SUBCOMMAND [args]", "", "subcommands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv:  # a subcommand is required: no arguments is a mistake, not a request for help
        print(f"hybridrl: a subcommand is required\n\n{usage()}", file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"hybridrl: unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result = module.main(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
