"""The end-of-run PNG: score, response length and KL over steps, read from the tracker's metrics.jsonl.

    axes = plot_history("out/logs/metrics.jsonl", "out/history.png")

Panels (always three, in this order, so readers know where to look):
  1. score: critic/score/mean (training batches) and validation scores (val/score, val/test_score/*,
     val-core/{data_source}/reward/mean@n), the latter as markers since validation is sparse;
  2. response_length/mean;
  3. KL: actor/ppo_kl, plus actor/kl_loss and actor/reward_kl_penalty when logged.
A resumed run appends to the jsonl, so a step can appear twice: the later record wins. Non-finite
values (written as "nan"/"inf" strings) become gaps.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display is needed or wanted on a training node
import matplotlib.pyplot as plt  # noqa: E402

_VAL_SCORE = re.compile(r"^val(-core)?/(score|test_score/.+|.+/reward/mean@\d+)$")
PANELS = (
    ("score", ("critic/score/mean",), _VAL_SCORE),
    ("response length", ("response_length/mean",), None),
    ("KL", ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"), None),
)


def read_history(jsonl_path: str) -> dict[int, dict[str, float]]:
    """{step: {metric: value}}; a later record of the same step replaces the earlier one."""
    history: dict[int, dict[str, float]] = {}
    with open(jsonl_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            step = int(record.pop("step"))
            history[step] = {k: _number(v) for k, v in record.items()}
    return history


def _number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def series(history: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    steps = sorted(s for s, m in history.items() if key in m)
    return steps, [history[s][key] for s in steps]


def _panel_keys(history: dict[int, dict[str, float]], fixed: tuple, pattern: Any) -> list[str]:
    seen = {k for m in history.values() for k in m}
    keys = [k for k in fixed if k in seen]
    return keys + (sorted(k for k in seen if pattern.match(k)) if pattern else [])


def plot_history(jsonl_path: str, out_png: str, title: str = "") -> list[Any]:
    """Write the PNG; returns the three Axes (their lines hold the plotted data)."""
    history = read_history(jsonl_path)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 3 * len(PANELS)), sharex=True)
    for ax, (name, fixed, pattern) in zip(axes, PANELS):
        keys = _panel_keys(history, fixed, pattern)
        for key in keys:
            steps, values = series(history, key)
            sparse = key.startswith("val")
            ax.plot(steps, values, marker="o" if sparse else None, linestyle="--" if sparse else "-", label=key)
        if keys:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return list(axes)
