"""GSM8K reward with a format bonus, as a verl custom reward function:

    custom_reward_function.path=examples/rewards/gsm8k_format.py custom_reward_function.name=compute_score

score: 1.0 for the right number after "####", 0.1 for a well-formed "#### N" with the wrong number (verl's
gsm8k `format_score`), else 0. A small model that never writes the format gets no signal from the 0/1
reward; the bonus teaches the format first. `acc` reports strict correctness (validation: val-aux/.../acc).
"""
from hybridrl.reward import gsm8k


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.1):
    score = gsm8k.compute_score(solution_str, ground_truth, method="strict", format_score=format_score, score=1.0)
    return {"score": score, "acc": float(score == 1.0)}
