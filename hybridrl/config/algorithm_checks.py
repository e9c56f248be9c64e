"""The validation pass's algorithm part: estimator, policy loss, KL, aggregation, DAPO's dynamic sampling and
overlong buffer, rollout correction. Called once by validate(); problems name the keys and the fix.

It also decides what the rest of the job derives from these keys (AlgorithmPlan): the policy loss that
really runs (bypass_mode replaces it), the effective rollout correction (actor.tis_imp_ratio_cap = C > 0 is
the older spelling of rollout_is=token, rollout_is_threshold=C), and whether the actor's log-prob pass must
return sum_pi_squared.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .problems import Problems, choices, registry_names
from .schema import PPOConfig, RolloutCorrectionConfig

ARA = "actor_rollout_ref"
OFF_POLICY_TIS_CAP = 2.0  # verl's recommended TIS cap for one-step-off-policy training
RC = "algorithm.rollout_correction"
FILTER_SUMS = ("reward", "seq_reward", "seq_final_reward")  # metrics computed from the reward tensors


@dataclass(frozen=True)
class AlgorithmPlan:
    adv_estimator: str
    loss_mode: str  # the policy loss that runs (bypass_mode when algorithm.rollout_correction.bypass_mode)
    loss_agg_mode: str
    rollout_correction: Optional[RolloutCorrectionConfig]  # effective settings; None: off
    bypass_mode: bool  # old_log_probs are the rollout's (no old-log-prob pass)
    sum_pi_squared: bool  # the old-log-prob pass returns sum_pi_squared
    dynamic_sampling: bool  # algorithm.filter_groups.enable

    def describe(self) -> str:
        parts = [f"adv_estimator={self.adv_estimator}", f"loss_mode={self.loss_mode}",
                 f"loss_agg_mode={self.loss_agg_mode}"]
        if self.dynamic_sampling:
            parts.append("dynamic sampling (filter_groups)")
        rc = self.rollout_correction
        if rc is not None:
            parts.append(f"rollout correction is={rc.rollout_is}:{rc.rollout_is_threshold} rs={rc.rollout_rs}"
                         + (f" bypass({rc.loss_type})" if rc.bypass_mode else ""))
        return " ".join(parts)


def _registry_choice(key: str, value: str, registry: str, p: Problems) -> bool:
    names = registry_names("hybridrl.algos", registry)
    return names is None or choices(key, value, names, p)


def _estimator(cfg: PPOConfig, n: int, p: Problems) -> frozenset:
    a = cfg.algorithm
    if not _registry_choice("algorithm.adv_estimator", a.adv_estimator, "ADVANTAGE_ESTIMATORS", p):
        return frozenset()
    from hybridrl.algos import estimator_needs

    needs = estimator_needs(a.adv_estimator)
    p.check(not ("index" in needs and n < 2),
            f"algorithm.adv_estimator={a.adv_estimator} compares samples of the same prompt: set "
            f"{ARA}.rollout.n >= 2 (got {n})")
    keys, weights = a.gdpo_reward_keys, a.gdpo_reward_weights
    if a.adv_estimator == "gdpo":
        p.check(bool(keys), "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the fields of the dict "
                            "your reward function returns, e.g. \"['format_reward','accuracy_reward']\"")
        p.check(weights is None or len(weights) == len(keys or []),
                f"algorithm.gdpo_reward_weights has {len(weights or [])} values for {len(keys or [])} "
                "algorithm.gdpo_reward_keys; give one weight per key (or null)")
    elif keys or weights:
        p.notes.append(f"algorithm.gdpo_reward_keys/_weights have no effect with adv_estimator={a.adv_estimator}")
    return needs


def _kl(cfg: PPOConfig, p: Problems) -> None:
    from hybridrl.algos.kl import UNSUPPORTED

    for key, value in (("algorithm.kl_penalty", cfg.algorithm.kl_penalty),
                       (f"{ARA}.actor.kl_loss_type", cfg.actor_rollout_ref.actor.kl_loss_type)):
        if value in UNSUPPORTED:
            p.errors.append(f"{key}={value}: {UNSUPPORTED[value]}")
        else:
            _registry_choice(key, value, "KL_PENALTIES", p)


def _policy_loss(cfg: PPOConfig, p: Problems) -> None:
    actor, key = cfg.actor_rollout_ref.actor, f"{ARA}.actor"
    pl = actor.policy_loss
    _registry_choice(f"{key}.loss_agg_mode", actor.loss_agg_mode, "LOSS_AGG_MODES", p)
    _registry_choice(f"{key}.policy_loss.loss_mode", pl.loss_mode, "POLICY_LOSSES", p)
    mode = pl.loss_mode
    p.check(mode != "dro" or (pl.dro_beta is not None and pl.dro_beta > 0),
            f"{key}.policy_loss.loss_mode=dro needs {key}.policy_loss.dro_beta > 0 (got {pl.dro_beta})")
    p.check(mode != "clip_cov" or pl.clip_cov_ratio > 0, f"{key}.policy_loss.clip_cov_ratio must be > 0")
    p.check(mode != "clip_cov" or pl.clip_cov_lb < pl.clip_cov_ub,
            f"{key}.policy_loss.clip_cov_lb={pl.clip_cov_lb} must be below clip_cov_ub={pl.clip_cov_ub}")
    p.check(mode != "kl_cov" or pl.kl_cov_ratio > 0, f"{key}.policy_loss.kl_cov_ratio must be > 0")
    p.check(actor.tau_pos > 0 and actor.tau_neg > 0,
            f"{key}.tau_pos={actor.tau_pos} and {key}.tau_neg={actor.tau_neg} (sapo's gate temperatures) must be > 0")
    for k, v in ((f"{key}.loss_scale_factor", actor.loss_scale_factor),
                 ("critic.loss_scale_factor", cfg.critic.loss_scale_factor)):
        p.check(v is None or v > 0, f"{k}={v} must be null or > 0")
    if mode in ("sapo", "geo_mean") and actor.loss_agg_mode != "seq-mean-token-mean":
        p.notes.append(f"{key}.policy_loss.loss_mode={mode} aggregates by sequence itself; "
                       f"{key}.loss_agg_mode={actor.loss_agg_mode} applies to the entropy and KL terms only")


def _rollout_correction(cfg: PPOConfig, needs: frozenset, p: Problems) -> Optional[RolloutCorrectionConfig]:
    rc, actor = cfg.algorithm.rollout_correction, cfg.actor_rollout_ref.actor
    from hybridrl.algos import RolloutCorrection

    p.check(actor.policy_loss.rollout_correction == rc,
            f"{ARA}.actor.policy_loss.rollout_correction differs from {RC}: it follows {RC}; set the keys there")
    p.check(actor.tis_imp_ratio_cap <= 0 or actor.tis_imp_ratio_cap >= 1,
            f"{ARA}.actor.tis_imp_ratio_cap={actor.tis_imp_ratio_cap} must be >= 1 (or <= 0 to disable)")
    effective: Optional[RolloutCorrectionConfig] = rc
    if actor.tis_imp_ratio_cap > 0:
        if p.check(rc.rollout_is is None, f"{ARA}.actor.tis_imp_ratio_cap={actor.tis_imp_ratio_cap} and "
                                          f"{RC}.rollout_is={rc.rollout_is} are both set: tis_imp_ratio_cap=C is "
                                          f"{RC}.rollout_is=token {RC}.rollout_is_threshold=C; keep one"):
            effective = dataclasses.replace(rc, rollout_is="token", rollout_is_threshold=actor.tis_imp_ratio_cap)
    stale = "trainer.one_step_off_policy" if cfg.trainer.one_step_off_policy else \
        "async_training.enable" if cfg.async_training.enable else None
    if stale and not rc.bypass_mode and not RolloutCorrection.from_config(effective).enabled:
        # each batch comes from an earlier policy: without a correction the update would treat it as on-policy
        effective = dataclasses.replace(rc, rollout_is="token", rollout_is_threshold=OFF_POLICY_TIS_CAP)
        p.notes.append(f"{stale}=true: importance weights pi_old/pi_rollout truncated at "
                       f"{OFF_POLICY_TIS_CAP} (token TIS) correct for the stale rollout; set {RC}.rollout_is "
                       "to choose another correction")
    spec = RolloutCorrection.from_config(effective)
    p.errors.extend(spec.problems())
    mode = actor.policy_loss.loss_mode
    p.check(mode != "bypass_mode" or rc.bypass_mode,
            f"{ARA}.actor.policy_loss.loss_mode=bypass_mode needs {RC}.bypass_mode=true (it corrects against the "
            "rollout's log-probs, which then stand in for the old log-probs)")
    if rc.bypass_mode:
        p.check(mode in ("vanilla", "bypass_mode"),
                f"{RC}.bypass_mode=true replaces the policy loss with bypass_mode ({RC}.loss_type picks ppo_clip or "
                f"reinforce); {ARA}.actor.policy_loss.loss_mode={mode} would be ignored: set it to vanilla")
        p.check(not needs & {"old_log_probs", "sum_pi_squared"},
                f"{RC}.bypass_mode=true skips the old-log-prob pass that algorithm.adv_estimator="
                f"{cfg.algorithm.adv_estimator} reads; turn one of them off")
    if not spec.enabled:
        return None
    p.check(cfg.actor_rollout_ref.rollout.calculate_log_probs,
            f"{RC} (or {ARA}.actor.tis_imp_ratio_cap) needs the rollout's log-probs: set "
            f"{ARA}.rollout.calculate_log_probs=true")
    return effective


def _dynamic_sampling(cfg: PPOConfig, n: int, p: Problems) -> bool:
    fg = cfg.algorithm.filter_groups
    if not fg.enable:
        return False
    p.check(bool(fg.metric), "algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric (e.g. reward "
                             "or acc)")
    p.check(not (fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward),
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: groups are "
            "filtered right after scoring, before the KL is known; use metric=reward")
    if n < 2:
        p.notes.append(f"algorithm.filter_groups with {ARA}.rollout.n=1: groups of one are always kept")
    if fg.max_inflight_gen_batches != 1:
        p.notes.append(f"algorithm.filter_groups.max_inflight_gen_batches={fg.max_inflight_gen_batches} is accepted "
                       "for verl compatibility; generation batches run one at a time")
    return True


def _overlong(cfg: PPOConfig, p: Problems) -> None:
    ob, longest = cfg.reward_model.overlong_buffer, cfg.data.max_response_length
    if ob.enable:
        p.check(0 < ob.len <= longest, f"reward_model.overlong_buffer.len={ob.len} must be in "
                                       f"(0, data.max_response_length={longest}]")
        p.check(ob.penalty_factor >= 0, f"reward_model.overlong_buffer.penalty_factor={ob.penalty_factor} must be >= 0")


def check_algorithm(cfg: PPOConfig, n: int, p: Problems) -> AlgorithmPlan:
    """Check the algorithm keys (recording problems in `p`) and derive the plan."""
    a, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    needs = _estimator(cfg, n, p)
    _kl(cfg, p)
    _policy_loss(cfg, p)
    choices("algorithm.kl_ctrl.type", a.kl_ctrl.type, ["fixed", "adaptive"], p)
    p.check(0 <= a.gamma <= 1 and 0 <= a.lam <= 1, "algorithm.gamma and algorithm.lam must be in [0, 1]")
    p.check(not a.use_pf_ppo, "algorithm.use_pf_ppo=true is not supported yet; set it to false")
    if a.use_kl_in_reward and actor.use_kl_loss:
        p.notes.append("algorithm.use_kl_in_reward and actor.use_kl_loss are both on: KL is penalized twice")
    rc = _rollout_correction(cfg, needs, p)
    dynamic = _dynamic_sampling(cfg, n, p)
    _overlong(cfg, p)
    bypass = a.rollout_correction.bypass_mode
    return AlgorithmPlan(
        adv_estimator=a.adv_estimator, loss_mode="bypass_mode" if bypass else actor.policy_loss.loss_mode,
        loss_agg_mode=actor.loss_agg_mode, rollout_correction=rc, bypass_mode=bypass,
        sum_pi_squared=actor.calculate_sum_pi_squared or "sum_pi_squared" in needs, dynamic_sampling=dynamic,
    )
