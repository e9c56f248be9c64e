"""Scorer of the synthetic arithmetic task (hybridrl.data.arithmetic): the response IS the answer.

The response, stripped of surrounding whitespace, must be an integer literal ("7", "-3"): equal to
the ground truth -> score; a well-formed but wrong integer -> format_score; anything else (extra text,
"7 7", an empty response) -> 0.0. Strict on purpose: the tiny demo model is rewarded for answering
with the number and then stopping.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["compute_score", "compute_final_line_score"]

_INT = re.compile(r"-?\d+")


def compute_score(solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0) -> float:
    text = solution_str.strip()
    if not _INT.fullmatch(text):
        return 0.0
    return float(score) if int(text) == int(str(ground_truth).strip()) else float(format_score)


def compute_final_line_score(solution_str: str, ground_truth: Any) -> float:
    """The agent demo's task (data_source arithmetic_tool): a multi-turn response (tool calls and their
    results included) whose last line is the answer; 1.0 if that line is the ground-truth integer."""
    lines = solution_str.strip().splitlines()
    return compute_score(lines[-1] if lines else "", ground_truth)
