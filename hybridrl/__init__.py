"""hybridrl: Megatron-core RL post-training (PPO, GRPO) with vLLM rollout on the same GPUs."""

__version__ = "0.1.0"

import os as _os  # noqa: E402

# Ray's driver folds worker lines that look alike (digits ignored) into a later "[repeated Nx across cluster]"
# line: one rank's line stood for another's, and its note was Ray's on hybridrl's console. Every worker line is
# shown as printed, behind its (pid=...) prefix. Ray reads this when first imported, hence here; a value the user
# set is kept.
_os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# before anything can import transformer-engine: it must load the cuDNN torch uses (utils/cuda_libs.py says why)
from hybridrl.utils.cuda_libs import pin_cudnn_for_transformer_engine as _pin_cudnn  # noqa: E402

_pin_cudnn()
