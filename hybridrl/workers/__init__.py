"""Role workers the controller runs, one process per GPU (or CPU slot), all roles colocated:

    ActorRolloutRefWorker   the policy (Megatron), its rollout engine and the reference policy
    CriticWorker            the value model (Megatron)
    RewardModelWorker       a discriminative reward model (Megatron, forward only; reward_model.enable)
    RolloutWorker           a rollout engine on its own GPU (split placement: actor_rollout_ref.hybrid_engine=false)

Workers are thin: models live in hybridrl.adapters, generation in hybridrl.rollout, the weight sync in
hybridrl.hybrid. A worker wires them to the controller's dispatch modes.
"""
from .actor_rollout_ref import ROLLOUT_COMPUTE_PROTO, ActorRolloutRefWorker
from .critic import CriticWorker
from .reward_model import RewardModelWorker
from .rollout import RolloutWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker", "RolloutWorker", "ROLLOUT_COMPUTE_PROTO"]
