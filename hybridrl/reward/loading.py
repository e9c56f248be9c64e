"""Building the reward manager from config: reward_model.reward_manager + custom_reward_function.*.

    reward_fn = load_reward_fn(config.custom_reward_function, config.reward_model.reward_manager, tokenizer,
                               reward_fn_key=config.data.reward_fn_key)
    out = reward_fn(batch)            # RewardOutput

custom_reward_function.path names a .py file (or pkg://module) and .name the function in it
(verl's `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, or the list form
for the `batch` manager); it is loaded with hybridrl.utils.imports.load_object and checked up front to
accept the keywords the manager passes plus custom_reward_function.reward_kwargs. Without a path the
manager uses default_compute_score (dispatch by data_source).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from hybridrl.utils.imports import load_object

from .managers import REWARD_MANAGERS, RewardManager

__all__ = ["load_reward_fn", "load_custom_reward_fn"]


def load_custom_reward_fn(config: Any) -> Optional[Callable]:
    """The user's function at custom_reward_function.path/name, or None when no path is set."""
    if config is None or not getattr(config, "path", None):
        if config is not None and getattr(config, "reward_kwargs", None):
            raise ValueError("custom_reward_function.reward_kwargs is set but custom_reward_function.path is not; "
                             "the built-in scorers take no extra arguments")
        return None
    name = config.name or "compute_score"
    fn = load_object(config.path, name, key="custom_reward_function.path", name_key="custom_reward_function.name")
    if not callable(fn):
        raise TypeError(f"custom_reward_function.name={name}: {config.path} defines {name!r} as a "
                        f"{type(fn).__name__}, not a function")
    return fn


def _check_signature(fn: Callable, keywords: tuple[str, ...], reward_kwargs: dict, where: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables have no signature to check
    try:
        sig.bind(**{k: None for k in keywords}, **reward_kwargs)
    except TypeError as e:
        raise TypeError(f"{where}: must accept keyword arguments ({', '.join(keywords)}"
                        f"{', ' + ', '.join(reward_kwargs) if reward_kwargs else ''}); its signature is "
                        f"{fn.__name__}{sig}: {e}") from e


def load_reward_fn(custom_reward_function_config: Any, reward_manager_name: str = "naive", tokenizer: Any = None,
                   *, reward_fn_key: str = "data_source", num_examine: int = 0) -> RewardManager:
    """The reward manager `reward_manager_name` around the custom function or default_compute_score."""
    cls = REWARD_MANAGERS.get(reward_manager_name)
    fn = load_custom_reward_fn(custom_reward_function_config)
    reward_kwargs = dict(getattr(custom_reward_function_config, "reward_kwargs", None) or {})
    if fn is not None:
        keywords = getattr(cls, "call_keywords", None)
        if keywords:
            where = (f"custom_reward_function {custom_reward_function_config.path}:"
                     f"{custom_reward_function_config.name or 'compute_score'} (reward manager {reward_manager_name!r})")
            _check_signature(fn, tuple(keywords), reward_kwargs, where)
    return cls(tokenizer=tokenizer, compute_score=fn, reward_fn_key=reward_fn_key, reward_kwargs=reward_kwargs,
               num_examine=num_examine)
