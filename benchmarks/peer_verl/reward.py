"""The reward both trainers use in the side-by-side job (custom_reward_function.path, name compute_score).

GSM8K-style rows (data_source openai/gsm8k: the gsm_symbolic data) go to examples/rewards/gsm8k_format.py, the
function configs/grpo_smollm2_gsm8k.yaml names; anything else (the 1.5B job's arithmetic rows) to hybridrl's
data_source dispatch. verl loads this file in its reward workers, where the repository is not on sys.path.
"""
import importlib.util
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

_spec = importlib.util.spec_from_file_location("gsm8k_format", os.path.join(_REPO, "examples/rewards/gsm8k_format.py"))
_gsm8k_format = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gsm8k_format)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if data_source == "openai/gsm8k":
        return _gsm8k_format.compute_score(data_source, solution_str, ground_truth, extra_info)
    from hybridrl.reward.scoring import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
