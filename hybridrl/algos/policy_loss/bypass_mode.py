"""bypass_mode (verl 0.9): no old-log-prob pass; rollout correction between pi_theta and pi_rollout.

With algorithm.rollout_correction.bypass_mode=true the trainer uses the rollout engine's log-probs as
old_log_prob (two policies instead of three) and this loss is used. Here old_log_prob IS
rollout_log_prob. Per micro-batch it computes, without gradient, the rollout correction of the CURRENT
policy against the rollout (rollout_correction.py: IS weights from rollout_is/_threshold, rejection
from rollout_rs/_threshold, which drops tokens from the mask), then by rollout_correction.loss_type:
- ppo_clip: `vanilla` with ratio pi_theta / pi_rollout on the rejection-masked tokens; the IS weights
  are NOT applied (the ratio already is the correction; applying both would count it twice);
- reinforce: `reinforce` with the IS weights on the rejection-masked tokens.
The incoming rollout_is_weights are ignored (computed here). Metrics: the chosen loss's plus the
rollout correction's rollout_corr/*.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import rollout_corr as rc
from .base import POLICY_LOSSES, STANDARD_METRICS, PolicyLossOutput, PolicyLossParams, declare_metrics
from .reinforce import reinforce
from .vanilla import vanilla


def _metric_names(params: PolicyLossParams) -> list[str]:
    spec = params.policy_loss.rollout_correction
    base = ["actor/ppo_kl"] if spec.loss_type == "reinforce" else list(STANDARD_METRICS)
    return base + rc.metric_names(spec)


@POLICY_LOSSES.register("bypass_mode")
@declare_metrics(_metric_names)
def bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T] (old_log_prob = the rollout's log-probs); gradient flows through `log_prob` only."""
    params = config or PolicyLossParams()
    spec = params.policy_loss.rollout_correction
    correction = rc.rollout_correction(log_prob.detach(), old_log_prob, response_mask, spec)
    if spec.loss_type == "reinforce":
        out = reinforce(old_log_prob, log_prob, advantages, correction.response_mask, loss_agg_mode, params,
                        correction.weights)
    elif spec.loss_type == "ppo_clip":
        out = vanilla(old_log_prob, log_prob, advantages, correction.response_mask, loss_agg_mode, params, None)
    else:
        raise ValueError(f"algorithm.rollout_correction.loss_type={spec.loss_type!r} is not one of "
                         f"{', '.join(rc.LOSS_TYPES)}")
    return PolicyLossOutput(out.pg_loss, {**out.metrics, **correction.metrics})
