"""reward_model.combine.* and reward_model.judge.*: hybridrl's keys beside verl's reward_model.* (verl has neither:
there a reward model's score replaces the rule reward, and generative judges are custom reward functions)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .common import doc


@dataclass(frozen=True)
class RewardCombineConfig:
    """How the rule score (reward manager), the reward model's score and the judge's score make one reward."""

    mode: str = doc("replace: the model score is the reward, the rule scorer is not called (verl's behaviour) | sum: "
                    "rule_weight*rule + model_weight*rm + judge_weight*judge | gate: the rule score, plus the model "
                    "and judge parts only where the rule score >= gate_threshold.", "replace")
    rule_weight: float = doc("Weight of the rule score (sum, gate).", 1.0)
    model_weight: float = doc("Weight of the reward model's score.", 1.0)
    judge_weight: float = doc("Weight of the judge's score.", 1.0)
    gate_threshold: float = doc("gate: the lowest rule score that lets the model and judge parts count.", 1.0)
    per_data_source: dict[str, Any] = doc(
        "{data_source: {mode, rule_weight, model_weight, judge_weight, gate_threshold}}: overrides for the samples "
        "of that data source (unset fields keep the values above).", factory=dict)


@dataclass(frozen=True)
class JudgeConfig:
    """An LLM-as-judge reward: the judge's prompt from a file, its answer parsed into a score."""

    enable: bool = doc("Score responses with an LLM judge.", False)
    backend: str = doc("engine: the job's own rollout engine (the policy judges, greedy; torch on CPU, vLLM on GPU) | "
                       "endpoint: an OpenAI-compatible chat completions server at `url`.", "endpoint")
    prompt_path: Optional[str] = doc("A text file with the judge's prompt; {prompt}, {response} and {ground_truth} "
                                     "are replaced by the sample's.", None)
    url: Optional[str] = doc("endpoint: the server's base URL (…/v1); /chat/completions is appended.", None)
    model: Optional[str] = doc("endpoint: the model name sent with each request.", None)
    api_key_env: Optional[str] = doc("endpoint: the environment variable holding the API key (never the key itself).",
                                     None)
    score_pattern: str = doc("Regular expression whose first group is the score in the judge's answer (the last "
                             "match counts).", r"(-?\d+(?:\.\d+)?)")
    min_score: float = doc("Scores are clipped to [min_score, max_score] and then mapped to [0, 1].", 0.0)
    max_score: float = doc("See min_score.", 10.0)
    max_tokens: int = doc("Longest judge answer, in tokens.", 64)
    temperature: float = doc("endpoint: sampling temperature of the judge (the engine backend is greedy).", 0.0)
    timeout_s: float = doc("endpoint: seconds one request may take.", 30.0)
    max_retries: int = doc("endpoint: retries after a failed or unparsable request (with backoff).", 2)
    retry_backoff_s: float = doc("endpoint: the first retry's wait; doubles each retry.", 0.5)
    concurrency: int = doc("endpoint: requests in flight at once.", 8)
    cache_path: Optional[str] = doc("A JSON-lines file that keeps judgements across runs (null: in memory only).",
                                    None)
    on_failure: str = doc("What a failed judgement scores after its retries: error (stop the step) | skip (the judge "
                          "part of that sample is left out of the reward; counted in judge/failed).", "skip")
