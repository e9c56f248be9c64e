"""MATH-style scorer: the last \\boxed{...} answer, normalized and compared with the ground truth.

Semantics follow verl's hendrycks MATH scorer (reward_score/math.py):
  * answer: the last "\\boxed{...}" (braces may nest), or "\\boxed X" up to a "$", or "\\fbox{...}";
  * both strings normalized (`normalize_answer`): newlines, "\\!" and spaces removed, "\\\\" -> "\\",
    tfrac/dfrac -> frac, \\left/\\right removed, degrees (^\\circ) removed, "\\$" removed, a trailing
    unit "\\text{ ...}" removed, "\\%" removed, ".5" -> "0.5", a short "x = " prefix dropped,
    \\sqrt3 -> \\sqrt{3}, \\frac12 -> \\frac{1}{2} and \\frac1{72} -> \\frac{1}{72}, "a/b" of integers
    -> \\frac{a}{b}, and the single literal "0.5" -> \\frac{1}{2} (verl's special case);
  * equal after normalization -> 1.0, else 0.0.
When the `math_verify` package is importable, a response it judges equivalent (it parses LaTeX and
expressions, so "0.25" matches "\\frac{1}{4}") also scores 1.0; an internal math_verify failure
(e.g. its timeout) falls back to the string comparison, as in verl.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any, Optional

__all__ = ["last_boxed_only_string", "remove_boxed", "normalize_answer", "is_equiv", "compute_score",
           "math_verify_available"]


def math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def last_boxed_only_string(text: str) -> Optional[str]:
    """The last "\\boxed{...}" (or "\\fbox{...}", or "\\boxed X") of `text`, braces balanced; None if absent."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    if text.startswith("\\boxed ", idx):
        return "\\boxed " + text[idx + len("\\boxed "):].split("$")[0]
    depth = 0
    for j in range(idx, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[idx:j + 1]
    return None  # unbalanced: no complete answer


def remove_boxed(boxed: str) -> str:
    """The content of "\\boxed{...}" / "\\fbox{...}" / "\\boxed X"."""
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed "):]
    for left in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(left) and boxed.endswith("}"):
            return boxed[len(left):-1]
    raise ValueError(f"not a boxed answer: {boxed!r}")


def _fix_sqrt(s: str) -> str:
    parts = s.split("\\sqrt")
    out = parts[0]
    for p in parts[1:]:
        out += "\\sqrt" + (p if not p or p[0] == "{" else "{" + p[0] + "}" + p[1:])
    return out


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for p in parts[1:]:
        out += "\\frac"
        if p.startswith("{"):
            out += p
        elif len(p) < 2:
            return s  # malformed: leave the whole string as it was
        elif p[1] == "{":
            out += "{" + p[0] + "}" + p[1:]
        else:
            out += "{" + p[0] + "}{" + p[1] + "}" + p[2:]
    return out


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(-?\d+)", s)
    if m and s == f"{int(m.group(1))}/{int(m.group(2))}":
        return "\\frac{" + m.group(1) + "}{" + m.group(2) + "}"
    return s


def normalize_answer(s: str) -> str:
    s = str(s).replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:  # a unit on the right: "5 \text{ cm}" -> "5 "
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5", "x=5"
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(a: Optional[str], b: Optional[str]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return normalize_answer(a) == normalize_answer(b)
    except Exception:  # a normalization step choking on odd input: compare the raw strings
        return a == b


def _math_verify_equal(solution_str: str, ground_truth: str) -> Optional[bool]:
    """math_verify's verdict, or None when it is not installed or failed internally."""
    if not math_verify_available():
        return None
    try:
        from math_verify import parse, verify

        return bool(verify(parse("\\boxed{" + ground_truth + "}"), parse(solution_str)))
    except Exception:
        return None


def compute_score(solution_str: str, ground_truth: Any) -> float:
    truth = str(ground_truth)
    boxed = last_boxed_only_string(solution_str)
    if boxed is not None and is_equiv(remove_boxed(boxed), truth):
        return 1.0
    return 1.0 if _math_verify_equal(solution_str, truth) else 0.0
