"""Per-call cost of the Python tool's sandbox against its floor, measured in the same run.

floor: a bare `python -I -B -c CODE` child (what any process-per-call tool pays: interpreter start-up).
sandboxed: run_sandboxed(CODE) with every layer (namespaces + tmpfs, rlimits, capabilities, Landlock, seccomp),
the status pipe, bounded output reading and the folder's removal.
Prints milliseconds per call (median of --reps) for a trivial program and for one that imports numpy, and the
ratio sandboxed / floor. CPU only: `python benchmarks/sandbox_overhead.py [--reps 30] [--out results.json]`
(results: benchmarks/results/sandbox_overhead.md).
"""
import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from hybridrl.agent.tools.sandbox import run_sandboxed

PROGRAMS = {"print": "print(6 * 7)", "numpy": "import numpy as np\nprint(float(np.linalg.det(np.eye(3) * 2)))"}


def floor_ms(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-B", "-c", code], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    return (time.perf_counter() - t) * 1e3


def sandboxed_ms(code: str) -> float:
    t = time.perf_counter()
    r = asyncio.run(run_sandboxed(code, required_layers=("namespaces", "rlimits", "caps", "landlock", "seccomp")))
    assert r.returncode == 0, r.stderr
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", help="also write the rows as JSON to this file")
    args = ap.parse_args()
    reps, rows = args.reps, []
    print(f"{'program':8} {'floor ms':>9} {'sandboxed ms':>13} {'overhead ms':>12} {'ratio':>6}")
    for name, code in PROGRAMS.items():
        base, boxed = [], []
        for _ in range(reps):  # alternated, so that drift on a shared machine hits both alike
            base.append(floor_ms(code))
            boxed.append(sandboxed_ms(code))
        b, s = statistics.median(base), statistics.median(boxed)
        print(f"{name:8} {b:9.1f} {s:13.1f} {s - b:12.1f} {s / b:6.2f}")
        rows.append({"program": name, "floor_ms": b, "sandboxed_ms": s, "overhead_ms": s - b, "ratio": s / b,
                     "floor_p90_ms": _p90(base), "sandboxed_p90_ms": _p90(boxed)})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": f"python benchmarks/sandbox_overhead.py --reps {reps}", "reps": reps,
                       "machine": f"{platform.machine()}, {os.cpu_count()} cores, kernel {platform.release()}",
                       "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


if __name__ == "__main__":
    main()
