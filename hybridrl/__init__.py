"""hybridrl: Megatron-core RL post-training (PPO, GRPO) with vLLM rollout on the same GPUs."""

__version__ = "0.1.0"
