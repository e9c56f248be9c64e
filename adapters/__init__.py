"""Model backends behind one interface (installed as `hybridrl.adapters`).

`base` defines ActorModel / CriticModel; `megatron/` implements them on megatron-core. A user adapter is
selected with actor_rollout_ref.actor.adapter.{path,name} and must subclass ActorModel.
"""
