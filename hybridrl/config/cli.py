"""Hydra-style command lines as verl users type them.

    python -m hybridrl.trainer.main_ppo [--config-name NAME] [--config-path DIR] [--cfg job] key=value ...

`--cfg job` prints the resolved config as YAML and exits (after validating it; problems go to stderr
with a non-zero exit).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from ..utils import logs
from .layout import RunConfig
from .loader import ConfigError, load_config, to_yaml
from .validate import validate


@dataclass(frozen=True)
class CommandLine:
    overrides: list[str]
    config_name: Optional[str]
    config_path: Optional[str]
    cfg_mode: Optional[str]


def parse_command_line(argv: Sequence[str], default_config: str = "ppo_trainer") -> CommandLine:
    parser = argparse.ArgumentParser(add_help=True, description="key=value overrides follow verl's config keys")
    parser.add_argument("--config-name", "-cn", default=default_config)
    parser.add_argument("--config-path", "-cp", default=None)
    parser.add_argument("--cfg", "-c", choices=["job", "all"], default=None, help="print the resolved config and exit")
    args, rest = parser.parse_known_args(list(argv))
    unknown = [a for a in rest if a.startswith("-") and not a.startswith("~")]
    if unknown:
        parser.error(f"unrecognized options {unknown}; config values are passed as key=value")
    return CommandLine(rest, args.config_name, args.config_path, args.cfg)


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


def load_run(argv: Sequence[str], default_config: str = "ppo_trainer") -> tuple[CommandLine, RunConfig]:
    """Parse, compose and validate; on a config mistake print it and exit with status 2."""
    cl = parse_command_line(argv, default_config)
    try:
        logs.setup()
        cfg = load_config(cl.overrides, cl.config_name, cl.config_path)
        if cl.cfg_mode:
            sys.stdout.write(to_yaml(cfg))
            sys.stdout.flush()
            run = _validate_for_printing(cfg)
        else:
            run = validate(cfg)
    except ConfigError as e:
        print(f"hybridrl: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if cl.cfg_mode:
        print("# derived:\n# " + run.summary().replace("\n", "\n# "), file=sys.stderr)
        raise SystemExit(0)
    return cl, run


@contextlib.contextmanager
def user_errors(prog: str = "hybridrl", also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """A ConfigError (or one of `also`) raised after load_run (data, model files, layout against the model, the
    run folder) reaches the user as load_run's do: one line naming the key, exit status 2, no traceback."""
    try:
        yield
    except (ConfigError, *also) as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _validate_for_printing(cfg) -> RunConfig:
    """`--cfg job` on a machine without a GPU (a login node) checks a GPU job as the GPU host will: if the
    config is wrong only for lack of a GPU here, the derived sizes are those of a GPU run (said on stderr);
    a real run on this machine still stops at validate() with the GPU message."""
    try:
        return validate(cfg)
    except ConfigError as here:
        import torch

        if torch.cuda.is_available():
            raise
        try:
            run = validate(cfg, cuda_available=lambda: True)
        except ConfigError:
            raise here from None
        problems = [line.strip(" -") for line in str(here).splitlines()[1:]] or [str(here)]
        print(f"hybridrl: this machine has no GPU; the derived sizes below assume one (running here would stop with: "
              f"{'; '.join(problems)})", file=sys.stderr)
        return run
