"""The 3D-HybridEngine: training and rollout share the ranks; each step the actor's weights move from
the Megatron layout (tp, pp, dp) into the rollout engine's layout (tp_g, dp_g).

- plan.py: ReshardPlan, the rank maps, prompt chunks and the export's collectives;
- weight_sync.py: WeightSync, the ordered memory phases and bucketed streaming, and
  generate_sequences, the per-step call of a rollout worker;
- direct.py: the direct copy of the actor's shards into the engine where the layouts match;
- remote.py: the cross-GPU direct copy: the pieces of the engine's shard that other ranks hold, point to point;
- checks.py: checksums after each sync, the rollout-vs-actor log-prob gap.
"""
from .checks import WeightSyncError, logprob_gap, tensor_checksum
from .plan import ReshardPlan
from .weight_sync import SyncOptions, WeightSync, generate_sequences

__all__ = ["ReshardPlan", "SyncOptions", "WeightSync", "WeightSyncError", "generate_sequences", "logprob_gap",
           "tensor_checksum"]
