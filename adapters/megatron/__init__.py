"""megatron-core backend of the ActorModel / CriticModel interface (see ../base.py).

Public API (what the workers, the rollout sync and the CLIs use):
    parallel.init_megatron(layout, seed, timeout_s)   megatron groups on an initialised torch.distributed
    parallel.dispatch_info() / destroy_megatron()
    MegatronActor(model_cfg, actor_cfg, layout, batch_plan, total_training_steps=...)   the policy
    MegatronActor.reference(model_cfg, ref_cfg, layout, micro_batch)                   frozen reference
    MegatronCritic(critic_cfg, layout, batch_plan, total_training_steps=...)           value model
    weights.export_hf_weights(chunks, arch, layout, bucket_bytes) -> Iterator[[(hf_name, tensor)]]
    checkpoint.save(path, role) / checkpoint.load(path, role)
Imports are lazy so `import hybridrl.adapters.megatron` does not pull in megatron-core.
"""
from __future__ import annotations

from typing import Any

__all__ = ["MegatronActor", "MegatronCritic"]


def __getattr__(name: str) -> Any:
    if name == "MegatronActor":
        from .actor import MegatronActor

        return MegatronActor
    if name == "MegatronCritic":
        from .critic import MegatronCritic

        return MegatronCritic
    raise AttributeError(name)
