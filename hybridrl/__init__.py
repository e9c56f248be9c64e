"""hybridrl: Megatron-core RL post-training (PPO, GRPO) with vLLM rollout on the same GPUs."""

__version__ = "0.1.0"

# before anything can import transformer-engine: it must load the cuDNN torch uses (utils/cuda_libs.py says why)
from hybridrl.utils.cuda_libs import pin_cudnn_for_transformer_engine as _pin_cudnn  # noqa: E402

_pin_cudnn()
