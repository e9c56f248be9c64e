"""GSM8K rule scorer with verl's semantics (same inputs, same scores).

Only the last 300 characters of the response are searched (the answer sits at the end, and regexes
over very long responses are slow).
  * strict:   the LAST "#### N" (N = optional minus, digits, dots, commas), commas and dollar signs
              removed. Note that "#### 42." extracts "42." and does not match "42" (as in verl).
  * flexible: the last number-like run (-?[0-9.,]+) that is not just "." ; commas are kept, as in verl.
The extracted string is compared with str(ground_truth) as a string. No answer found -> 0;
answer found but wrong -> format_score; right -> score.
"""
from __future__ import annotations

import re
from typing import Any, Optional

__all__ = ["extract_solution", "compute_score"]

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"(-?[0-9.,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> Optional[str]:
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k: method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    candidates = [s for s in _NUMBER.findall(tail) if s not in ("", ".")]
    return candidates[-1] if candidates else None


def compute_score(solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == str(ground_truth) else float(format_score)
