"""GRPO with a reward model through the real CPU stack (Ray, megatron-core over gloo, the torch engine): a tiny
reward model, trained here to prefer responses that contain the digit 7, raises the share of such responses.

The reward model is a Llama *ForSequenceClassification with the demo's character vocabulary but ANOTHER chat
template (a bare "prompt" + "response==" layout), so the trainer must decode each sample with the policy's
tokenizer and re-render it in the reward model's template (verl's input_tokenizer behaviour) before scoring:
trained only on that layout, the reward model would score the policy's ChatML tokens as noise.
What only the whole stack shows: the reward model worker runs in the actor's processes beside the actor, its
score (combine mode replace, verl's behaviour) is the only reward, and GRPO follows it.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(420)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RM_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}=={% endif %}{% endfor %}"
TARGET = "7"


def rm_texts(rng: random.Random, n: int) -> tuple[list[str], list[float]]:
    """Conversations in the reward model's layout and labels: 1 where the response holds a 7."""
    texts, labels = [], []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        response = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.3:  # plenty of positives, also where the right answer has no 7
            response = response[:-1] + TARGET
        texts.append(f"{a}+{b}={response}==")
        labels.append(float(TARGET in response))
    return texts, labels


def train_reward_model(folder: str, seed: int = 0) -> float:
    """A tiny reward model for the property, saved as a HF folder (with its tokenizer); returns held-out accuracy."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from hybridrl.data.tokenizer import build_tiny_tokenizer
    from hybridrl.trainer.demo import DEMO_ALPHABET

    tok = build_tiny_tokenizer(alphabet=DEMO_ALPHABET)
    tok.chat_template = RM_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_labels=1,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)

    def encode(texts):
        enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    for _ in range(250):
        texts, labels = rm_texts(rng, 64)
        ids, mask = encode(texts)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
    texts, labels = rm_texts(random.Random(seed + 1), 400)
    with torch.no_grad():
        ids, mask = encode(texts)
        pred = model(input_ids=ids, attention_mask=mask).logits[:, 0] > 0
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return float((pred == torch.tensor(labels).bool()).float().mean())


def share_with_target(path: str) -> float:
    rows = [json.loads(line) for line in open(path)]
    return sum(TARGET in r["output"] for r in rows) / len(rows)


def test_grpo_follows_a_trained_reward_model(demo_prepared, tmp_path):
    rm_dir = str(tmp_path / "rm")
    accuracy = train_reward_model(rm_dir)
    assert accuracy > 0.9, f"the reward model did not learn the property (held-out accuracy {accuracy})"
    out, dumps = tmp_path / "run", tmp_path / "rollouts"
    steps = 10
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    # the demo's job (configs/demo.yaml) on the demo's data and warmed-up model (tests/e2e/conftest.py)
    cmd = [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-name", "demo",
           f"data.train_files={demo_prepared['train']}", f"data.val_files={demo_prepared['test']}",
           f"actor_rollout_ref.model.path={demo_prepared['model']}", f"trainer.default_local_dir={out / 'checkpoints'}",
           f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
           "trainer.val_before_train=false", f"trainer.rollout_data_dir={dumps}", "data.return_raw_chat=true",
           "actor_rollout_ref.actor.use_kl_loss=false", "reward_model.enable=true",
           # twice the demo's rate: at 1e-3 the share rose 0.09 -> 0.71 on the machine this test was written on but
           # only 0.09 -> 0.18 on another CPU (AMD EPYC, same code and packages, 2026-11-28); at 2e-3, 0.09 -> 0.91
           "actor_rollout_ref.actor.optim.lr=2e-3",
           f"reward_model.model.path={rm_dir}", "reward_model.micro_batch_size_per_gpu=64"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "reward: reward model (micro-batch 64), combine=replace" in proc.stdout
    rows = [json.loads(line) for line in open(out / "checkpoints" / "logs" / "metrics.jsonl")]
    train = [r for r in rows if "reward_model/score_mean" in r]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    assert all(r["timing_s/reward_model"] > 0 for r in train)
    assert all(r["reward_model/truncated"] == 0 for r in train)  # logged only where samples were re-rendered
    # the reward is the reward model's score alone (replace): the logged score mean is the reward model's
    assert all(abs(r["critic/score/mean"] - r["reward_model/score_mean"]) < 1e-5 for r in train)
    first = share_with_target(dumps / "1.jsonl")
    last = sum(share_with_target(dumps / f"{s}.jsonl") for s in range(steps - 2, steps + 1)) / 3
    assert last > first + 0.15, f"share of responses with {TARGET!r}: step 1 {first:.2f}, last three steps {last:.2f}"
    scores = [r["reward_model/score_mean"] for r in train]
    print(f"reward model accuracy {accuracy:.3f}; share with {TARGET!r}: step 1 {first:.2f} -> last three {last:.2f}; "
          f"score mean {scores[0]:.2f} -> {scores[-1]:.2f}")
    assert sum(scores[-3:]) / 3 > scores[0], scores
