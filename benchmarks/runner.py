"""The mechanics under runs.py: a row of the run table is a function that yields actions, and this module performs
them one after another, or only lists them (`runs.py show`, the CPU tests).

Actions, in the order a row yields them:
- Step: a command under a time cap (coreutils `timeout`, as the shell runners had it), its output in OUT/NAME.log;
  prints `== NAME rc=RC Ns` and the log's last lines (lines saying "warn" left out). The run's exit status is the
  first non-zero one of its steps and commands.
- Command: a command in the foreground (reports, the plan), its output on the terminal or in files.
- Capture: a command whose one output line the row needs (a model folder, the GPU's memory).
- Show: the lines of files that match a pattern (what the shell runners grep'ed from a step's log).
- Note, Fresh, WriteJson: a line to print, a folder made empty, a small JSON file.
A row's function only reads the disk: listing a run must change nothing, so every write is an action.
While listing, an action gives back its `placeholder` instead of a result.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Mapping, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CALL_CAP_S = 600  # one device call; every run is built to end inside it


@dataclass
class Context:
    """What a row's function reads: where the run writes, CPU or GPU, its arguments and knobs, its environment."""

    out: str  # logs under OUT, results under OUT/results
    cpu: bool = False  # the CPU dry run (tiny model, gloo, the torch engine) where the row has one
    args: tuple[str, ...] = ()  # the row's positional arguments (scalemodel SHAPE..., multi_grpo NAME NGPUS ...)
    knobs: Mapping[str, str] = field(default_factory=dict)  # the row's declared knobs, resolved (Run.knobs)
    env: Mapping[str, str] = field(default_factory=dict)  # the environment every command of the run gets
    python: str = sys.executable
    listing: bool = False  # True: nothing runs, the actions are only collected
    started: float = field(default_factory=time.time)

    def knob(self, name: str) -> str:
        return self.knobs[name]

    def words(self, name: str) -> list[str]:
        """A knob holding extra arguments, split on white space as the shell runners split them."""
        return self.knobs[name].split()

    def path(self, *parts: str) -> str:
        return os.path.join(self.out, *parts)

    def elapsed(self) -> float:
        return time.time() - self.started


def run_gpus(n: int, what: str = "this run") -> str:
    """The GPUs a run of n GPUs takes: the first n of the caller's CUDA_VISIBLE_DEVICES (a lease lane gives each row
    its own GPU: lease.sh phase_rows), else the machine's first n. Never GPUs the caller left out."""
    visible = [i.strip() for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip()]
    if not visible:
        return ",".join(str(i) for i in range(n))
    if len(visible) < n:
        raise SystemExit(f"{what} needs {n} GPUs; CUDA_VISIBLE_DEVICES={','.join(visible)} shows {len(visible)}")
    return ",".join(visible[:n])


def _environment(ctx: Context, extra: Optional[Mapping[str, str]]) -> dict[str, str]:
    return {**os.environ, **ctx.env, **(extra or {})}


@dataclass(frozen=True)
class Step:
    name: str
    cap_s: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    tail: int = 8  # log lines printed after it
    placeholder: Any = 0

    def commands(self) -> list[tuple[str, ...]]:
        return [self.argv]

    def perform(self, ctx: Context) -> int:
        log_path = ctx.path(f"{self.name}.log")
        start = time.time()
        with open(log_path, "w") as log:
            rc = subprocess.call(["timeout", str(int(self.cap_s)), *self.argv], stdout=log, stderr=subprocess.STDOUT,
                                 env=_environment(ctx, self.env), cwd=ROOT)
        print(f"== {self.name} rc={rc} {int(time.time() - start)}s", flush=True)
        if self.tail:
            lines = [ln for ln in _read_lines(log_path) if "warn" not in ln.lower()]
            print("".join(lines[-self.tail:]), end="", flush=True)
        return rc


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    stdout: Optional[str] = None  # a file instead of the terminal
    stderr: Optional[str] = None  # a file; with stdout and no stderr, both go to stdout's file
    tail: Optional[int] = None  # print only the last lines of its standard output
    env: Mapping[str, str] = field(default_factory=dict)
    placeholder: Any = 0

    def commands(self) -> list[tuple[str, ...]]:
        return [self.argv]

    def perform(self, ctx: Context) -> int:
        env = _environment(ctx, self.env)
        if self.stdout:
            with open(self.stdout, "w") as out, open(self.stderr or os.devnull, "w") as err:
                return subprocess.call(self.argv, stdout=out, stderr=err if self.stderr else subprocess.STDOUT,
                                       env=env, cwd=ROOT)
        if self.tail is None:
            return subprocess.call(self.argv, env=env, cwd=ROOT)
        proc = subprocess.run(self.argv, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        print("".join(proc.stdout.splitlines(keepends=True)[-self.tail:]), end="", flush=True)
        return proc.returncode


@dataclass(frozen=True)
class Capture:
    argv: tuple[str, ...]
    placeholder: str  # what a listing gets instead of the output
    line: int = -1  # which line of the standard output: the last (a progress line may come before it) or the first
    env: Mapping[str, str] = field(default_factory=dict)

    def commands(self) -> list[tuple[str, ...]]:
        return [self.argv]

    def perform(self, ctx: Context) -> str:
        try:
            proc = subprocess.run(self.argv, stdout=subprocess.PIPE, text=True, env=_environment(ctx, self.env),
                                  cwd=ROOT)
        except OSError:  # no such program here (nvidia-smi on a CPU machine): as an empty output
            return ""
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        return lines[self.line] if lines else ""


@dataclass(frozen=True)
class Show:
    paths: tuple[str, ...]  # glob patterns; files that do not exist are passed over
    pattern: str = ""  # a regular expression (re.search); "" shows every line
    exclude: str = ""  # lines matching it are left out (case-insensitive)
    tail: Optional[int] = None
    prefix: str = ""  # printed before the lines, on the first one's line
    placeholder: Any = None

    def commands(self) -> list[tuple[str, ...]]:
        return []

    def perform(self, ctx: Context) -> None:
        lines = [ln for p in self.paths for f in sorted(glob.glob(p)) for ln in _read_lines(f)]
        lines = [ln for ln in lines if (not self.pattern or re.search(self.pattern, ln))
                 and not (self.exclude and re.search(self.exclude, ln, re.I))]
        shown = lines[-self.tail:] if self.tail else lines
        print(self.prefix + " ".join(ln.rstrip("\n") for ln in shown) if self.prefix else "".join(shown), end="",
              flush=True)
        if self.prefix:
            print(flush=True)


@dataclass(frozen=True)
class Note:
    text: str
    placeholder: Any = None

    def commands(self) -> list[tuple[str, ...]]:
        return []

    def perform(self, ctx: Context) -> None:
        print(self.text, flush=True)


def fresh_folder(path: str) -> None:
    """An empty folder at `path` for one run. The trainer appends to its metrics.jsonl, so a folder that already
    holds files is an earlier run's: the row stops there, naming it, and deletes nothing."""
    if os.path.isdir(path) and os.listdir(path):
        raise SystemExit(f"runner: {path} holds an earlier run's files; run with another --out (nothing was "
                         "deleted or overwritten)")
    os.makedirs(path, exist_ok=True)


@dataclass(frozen=True)
class Fresh:
    """An empty folder at `path` (fresh_folder)."""

    path: str
    placeholder: Any = None

    def commands(self) -> list[tuple[str, ...]]:
        return []

    def perform(self, ctx: Context) -> None:
        fresh_folder(self.path)


@dataclass(frozen=True)
class WriteJson:
    path: str
    record: Mapping[str, Any]
    indent: Optional[int] = 1
    placeholder: Any = None

    def commands(self) -> list[tuple[str, ...]]:
        return []

    def perform(self, ctx: Context) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump(dict(self.record), f, indent=self.indent)


Actions = Generator[Any, Any, None]  # what a row's function is: it yields actions and receives their results


@dataclass(frozen=True)
class Run:
    """One row of the run table."""

    name: str
    what: str
    steps: Callable[[Context], Actions]
    gpus: int = 1
    cap_s: int = CALL_CAP_S
    results: tuple[str, ...] = ()  # files under benchmarks/results/ the run (or its report) writes
    knobs: Mapping[str, str] = field(default_factory=dict)  # NAME -> default; `--set NAME=V` or $NAME sets one
    cpu: bool = False  # the row has a CPU dry run (its function reads ctx.cpu)
    params: str = ""  # its positional arguments, if any (the usage line)
    env: Mapping[str, str] = field(default_factory=dict)


def perform(actions: Actions, ctx: Context) -> int:
    """Run the actions; the exit status is the first non-zero one of its steps and commands."""
    status, result = 0, None
    while True:
        try:
            action = actions.send(result)
        except StopIteration:
            return status
        result = action.perform(ctx)
        if isinstance(action, (Step, Command)) and result and not status:
            status = result


def listing(actions: Actions, ctx: Context) -> list[Any]:
    """The actions a run would perform, each given its placeholder as its result (nothing runs)."""
    assert ctx.listing, "listing() is for a Context(listing=True)"
    out, result = [], None
    while True:
        try:
            action = actions.send(result)
        except StopIteration:
            return out
        out.append(action)
        result = action.placeholder


def bash_quote(word: str) -> str:
    """`printf %q` of bash: what peer_verl's command.txt files hold (report.py shows them as written)."""
    if not word:
        return "''"
    quoted = re.sub(r"""([!"$&'()*,;<>?\[\\\]^`{|}\s])""", r"\\\1", word)
    return "\\" + quoted if quoted[0] in "#~" else quoted


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.readlines()
    except OSError:
        return []
