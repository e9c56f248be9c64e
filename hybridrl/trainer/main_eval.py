"""Score generated responses offline: mean score and pass@k per data_source (verl's main_eval).

    python -m hybridrl.trainer.main_eval data.path=gen.parquet data.response_key=responses \
        [custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score]

Input: a parquet with one row per prompt (main_generation's output): a list of n responses, the
data_source and reward_model.ground_truth. Each response is scored by the reward function the trainer
would use (the built-in scorers by data_source, or custom_reward_function), called as
`fn(data_source=, solution_str=, ground_truth=, extra_info=)`.

pass@k is the unbiased estimator of Chen et al. 2021 (Codex): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), averaged over prompts, for k = 1, 2, 4, ... <= n (the smallest n
of the group, so every prompt contributes to every k). A response is correct when its score >=
pass_threshold, or, for a reward that returns a dict with `acc`, when acc is true.
The results go to stdout and to a JSON file (data.output_path, default <input>.eval.json).
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hybridrl.config.cli import parse_command_line
from hybridrl.config.loader import ConfigError, load_config, to_yaml
from hybridrl.config.schema.critic import CustomRewardFunctionConfig
from hybridrl.config.schema.evaluation import EvalConfig, EvalDataConfig
from hybridrl.reward import RewardFunctionError, RewardManager, load_reward_fn
from hybridrl.utils import logs


# ------------------------------------------------------------------------------------------ pass@k
def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), as the product 1 - prod_{i=n-c+1..n} (1 - k/i), which stays exact-ish
    without the huge binomials."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


# ------------------------------------------------------------------------------------------ scoring
@dataclass(frozen=True)
class Scored:
    data_source: str
    scores: list[float]
    correct: list[bool]


def load_scorer(cfg: CustomRewardFunctionConfig) -> RewardManager:
    """The trainer's per-sample reward manager: it holds the function (custom_reward_function.path/name,
    signature-checked, or the built-in scorers by data_source), its reward_kwargs and the result check."""
    return load_reward_fn(cfg, "naive")


def _score_one(scorer: RewardManager, data_source: str, response: str, truth: Any, extra: Any,
               threshold: float, where: Callable[[], str]) -> tuple[float, bool]:
    extra = dict(extra) if isinstance(extra, dict) else extra  # the function may mutate its copy
    try:
        result = scorer.compute_score(data_source=data_source, solution_str=response, ground_truth=truth,
                                      extra_info=extra, **scorer.reward_kwargs)
    except Exception as e:
        raise RewardFunctionError(f"the reward function raised {type(e).__name__}: {e}\non {where()}") from e
    score, fields = scorer.check_result(result, where)  # a number, or a dict with a finite "score"
    return score, bool(fields["acc"]) if fields and "acc" in fields else score >= threshold


def _describe(row: int, j: int, data_source: str, prompt: Any, response: str, truth: Any) -> str:
    def clip(x: Any, n: int = 300) -> str:
        s = str(x)
        return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"

    return (f"row {row}, response {j}, data_source={data_source!r}\n  prompt: {clip(prompt)}\n"
            f"  response: {clip(response)}\n  ground_truth: {clip(truth)}")


def _ground_truth(value: Any, key: str, row: int) -> Any:
    if not isinstance(value, dict) or "ground_truth" not in value:
        raise ValueError(f"row {row}: data.reward_model_key={key} holds {value!r:.120}, expected a dict with 'ground_truth'")
    return value["ground_truth"]


def score_rows(rows: Sequence[dict], data: EvalDataConfig, scorer: RewardManager, threshold: float) -> list[Scored]:
    """Score every response of every row; a reward function that raises stops with the sample shown."""
    out = []
    for i, row in enumerate(rows):
        responses = row[data.response_key]
        responses = [responses] if isinstance(responses, str) else list(responses)
        if not responses:
            raise ValueError(f"row {i}: data.response_key={data.response_key} holds no responses")
        source = str(row[data.data_source_key])
        truth = _ground_truth(row[data.reward_model_key], data.reward_model_key, i)
        scores, correct = [], []
        for j, response in enumerate(responses):
            where = functools.partial(_describe, i, j, source, row.get(data.prompt_key), response, truth)
            s, ok = _score_one(scorer, source, response, truth, row.get(data.extra_info_key), threshold, where)
            scores.append(s)
            correct.append(ok)
        out.append(Scored(source, scores, correct))
    return out


def summarize(scored: Sequence[Scored]) -> dict[str, float]:
    """Prompt-averaged mean score and pass@k of a group of rows."""
    n_min = min(len(s.scores) for s in scored)
    summary = {"num_prompts": len(scored), "num_responses": sum(len(s.scores) for s in scored),
               "mean_score": float(np.mean([np.mean(s.scores) for s in scored]))}
    for k in ks_for(n_min):
        summary[f"pass@{k}"] = float(np.mean([pass_at_k(len(s.correct), sum(s.correct), k) for s in scored]))
    return summary


def evaluate(rows: Sequence[dict], cfg: EvalConfig, scorer: RewardManager) -> dict[str, Any]:
    """{"overall": {...}, "per_data_source": {source: {...}}, "metrics": verl-style flat names}."""
    scored = score_rows(rows, cfg.data, scorer, cfg.pass_threshold)
    if not scored:
        raise ValueError(f"data.path={cfg.data.path}: no rows")
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        groups.setdefault(s.data_source, []).append(s)
    per_source = {name: summarize(g) for name, g in sorted(groups.items())}
    metrics = {}
    for name, summary in per_source.items():
        metrics[f"test_score/{name}"] = summary["mean_score"]  # verl's main_eval prints this name
        metrics.update({f"{k}/{name}": v for k, v in summary.items() if k.startswith("pass@")})
    return {"overall": summarize(scored), "per_data_source": per_source, "metrics": metrics}


# ------------------------------------------------------------------------------------------ I/O
def read_rows(data: EvalDataConfig) -> list[dict]:
    import pyarrow.parquet as pq

    if not data.path:
        raise ConfigError("data.path is required: the parquet written by main_generation")
    path = os.path.expanduser(data.path)
    if not os.path.isfile(path):
        raise ConfigError(f"data.path={data.path}: no such file")
    table = pq.read_table(path)
    for key in ("response_key", "data_source_key", "reward_model_key"):
        column = getattr(data, key)
        if column not in table.column_names:
            raise ConfigError(f"data.{key}={column}: {path} has no such column (columns: {table.column_names})")
    return table.to_pylist()


def output_path(data: EvalDataConfig) -> str:
    if data.output_path:
        return os.path.expanduser(data.output_path)
    return os.path.splitext(os.path.expanduser(data.path))[0] + ".eval.json"


def format_table(results: dict[str, Any]) -> str:
    rows = [*results["per_data_source"].items(), ("overall", results["overall"])]
    cols = [c for c in results["overall"] if c != "num_responses"]
    width = max(len("data_source"), *(len(name) for name, _ in rows))
    lines = [f"{'data_source':<{width}}  " + "  ".join(f"{c:>11}" for c in cols)]
    for name, summary in rows:
        cells = [f"{summary[c]:>11.4f}" if isinstance(summary.get(c), float) else f"{summary.get(c, ''):>11}"
                 for c in cols]
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def run(cfg: EvalConfig) -> dict[str, Any]:
    """Score cfg.data.path, print the table, write the JSON; returns the results."""
    rows = read_rows(cfg.data)
    results = evaluate(rows, cfg, load_scorer(cfg.custom_reward_function))
    results["input"] = os.path.abspath(os.path.expanduser(cfg.data.path))
    out = output_path(cfg.data)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(format_table(results))
    print(json.dumps(results["metrics"]))
    print(f"main_eval: wrote {out}")
    return results


def main(argv: Optional[list[str]] = None) -> int:
    cl = parse_command_line(sys.argv[1:] if argv is None else argv, default_config="evaluation")
    try:
        logs.setup()
        cfg = load_config(cl.overrides, cl.config_name, cl.config_path, schema=EvalConfig)
        if cl.cfg_mode:
            sys.stdout.write(to_yaml(cfg))
            return 0
        run(cfg)
    except ConfigError as e:
        print(f"hybridrl: {e}", file=sys.stderr)
        return 2
    except (RewardFunctionError, ImportError, AttributeError, TypeError, ValueError) as e:
        # bad reward function file/name/signature, malformed rows, or a failing sample: the message says which
        print(f"main_eval: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
