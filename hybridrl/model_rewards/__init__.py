"""Rewards from models, combined with the rule rewards of hybridrl.reward: combined.py (rule + reward model + judge,
per data source), rm_inputs.py (what the reward model reads, re-rendered for its tokenizer where it differs),
judge.py / judge_endpoint.py (LLM-as-judge, JUDGE_BACKENDS).

A layer above config/ and data/, apart from hybridrl.reward: these modules assemble from the validated
reward_model.* (RewardPlan, JudgeConfig) and load tokenizers, while config/ validates the rule reward registries
below it; in one package the two would import each other."""
