"""A custom reward function that takes a secret (custom_reward_function.reward_kwargs.api_token) and
otherwise scores exactly as the built-in scorers: the secret must reach it, and must appear nowhere else."""
from __future__ import annotations

import hashlib

from hybridrl.reward.scoring import default_compute_score

# sha256 of the token the fault tests pass; the token itself is not written here
EXPECTED_SHA256 = "e7af14dde2b5f524c6131ead54821238af944ea7cc2200afddb25c1d34c5b4cb"


def compute_score(data_source, solution_str, ground_truth, extra_info=None, api_token=None):
    if api_token is None or hashlib.sha256(api_token.encode()).hexdigest() != EXPECTED_SHA256:
        raise ValueError("token_reward: api_token did not arrive intact")
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
