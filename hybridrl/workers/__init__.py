"""Role workers the controller runs, one process per GPU (or CPU slot), all roles colocated:

    ActorRolloutRefWorker   the policy (Megatron), its rollout engine and the reference policy
    CriticWorker            the value model (Megatron)

Workers are thin: models live in hybridrl.adapters, generation in hybridrl.rollout, the weight sync in
hybridrl.hybrid. A worker wires them to the controller's dispatch modes.
"""
from .actor_rollout_ref import ROLLOUT_COMPUTE_PROTO, ActorRolloutRefWorker
from .critic import CriticWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "ROLLOUT_COMPUTE_PROTO"]
