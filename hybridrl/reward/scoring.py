"""default_compute_score: the rule scorer for a sample, chosen by its data_source (verl's dispatch).

    openai/gsm8k                                   -> gsm8k.compute_score (strict)
    lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500,
    and other MATH-style sources listed in MATH_SOURCES -> math_boxed.compute_score
    arithmetic                                     -> arithmetic.compute_score
    arithmetic_tool (the agent demo)               -> arithmetic.compute_final_line_score
Anything else is a NotImplementedError that says how to plug a scorer in: a file with
`compute_score(data_source, solution_str, ground_truth, extra_info=None)` given as
custom_reward_function.path (and .name), or `register_data_source` from Python.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

from . import arithmetic, gsm8k, math_boxed

__all__ = ["default_compute_score", "default_compute_score_batch", "register_data_source", "data_sources",
           "MATH_SOURCES"]

MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                "hendrycks/competition_math", "EleutherAI/hendrycks_math")

# data_source -> fn(solution_str, ground_truth) -> float
_SCORERS: dict[str, Callable[[str, Any], float]] = {"openai/gsm8k": gsm8k.compute_score,
                                                     "arithmetic": arithmetic.compute_score,
                                                     "arithmetic_tool": arithmetic.compute_final_line_score}
_SCORERS.update({s: math_boxed.compute_score for s in MATH_SOURCES})


def register_data_source(names: str | Iterable[str], fn: Callable[[str, Any], float], override: bool = False) -> None:
    """Score data_source(s) `names` with fn(solution_str, ground_truth) in default_compute_score."""
    for name in [names] if isinstance(names, str) else list(names):
        if name in _SCORERS and not override and _SCORERS[name] is not fn:
            raise ValueError(f"data_source {name!r} already has a scorer; pass override=True to replace it")
        _SCORERS[name] = fn


def data_sources() -> list[str]:
    return sorted(_SCORERS)


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: Optional[dict] = None) -> float:
    fn = _SCORERS.get(data_source)
    if fn is None:
        raise NotImplementedError(
            f"no rule scorer for data_source={data_source!r} (known: {', '.join(data_sources())}). Write a file with "
            "`def compute_score(data_source, solution_str, ground_truth, extra_info=None)` and pass "
            "custom_reward_function.path=<file> (custom_reward_function.name=compute_score)")
    return fn(solution_str, ground_truth)


def default_compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str],
                                ground_truths: Sequence[Any], extra_infos: Sequence[Optional[dict]]) -> list[float]:
    """default_compute_score over lists (the `batch` reward manager's signature)."""
    return [default_compute_score(d, s, g, e) for d, s, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)]
