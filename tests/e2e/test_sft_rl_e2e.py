"""SFT on tool-call traces with torchrun (2 ranks, dp=2, megatron-core over gloo), then GRPO with the agent loop
(Ray, 2 workers) started from the SFT's huggingface/ export as it is: no conversion step.

What only the whole stack shows:
- step 1's train/loss is the float64 NLL of the initial model over the assistant tokens of the first batch, the
  masks written out here by hand (tool call + <|im_end|>, answer + <|im_end|>; user, tool and headers not);
- the exported folder holds the trained weights: transformers on it gives the last val/loss the workers logged;
- main_ppo trains from actor_rollout_ref.model.path=.../global_step_2/huggingface.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'


def conversation_pieces(expression: str, answer: str) -> list[tuple[str, int]]:
    """(text, trained) pieces of a products trace under the tiny tokenizer's ChatML template, by hand."""
    return [(f"<|im_start|>user\n{expression}=<|im_end|>\n<|im_start|>assistant\n", 0),
            (CALL.format(expression) + "<|im_end|>", 1),
            (f"\n<|im_start|>tool\n{answer}<|im_end|>\n<|im_start|>assistant\n", 0), (f"{answer}<|im_end|>", 1),
            ("\n", 0)]


def float64_nll(model_dir: str, tok, rows: list[dict]) -> float:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    total = tokens = 0.0
    for r in rows:
        ids, mask = [], []
        for text, trained in conversation_pieces(r["extra_info"]["expression"], r["reward_model"]["ground_truth"]):
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [trained] * len(piece)
        x = torch.tensor([ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].double(), -1)
        picked = logp.gather(-1, x[0, 1:, None])[:, 0]
        m = torch.tensor(mask[1:], dtype=torch.float64)
        total += float(-(picked * m).sum())
        tokens += float(m.sum())
    return total / tokens


def run(cmd: list[str], timeout: int) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout


def test_sft_on_tool_traces_then_grpo_from_its_export(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridrl.data.gen_tool_traces import generate, write_rows
    from hybridrl.data.tokenizer import build_tiny_tokenizer
    from hybridrl.trainer.demo import save_model

    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    model_dir = str(tmp_path / "model")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    save_model(LlamaForCausalLM(config), tok, model_dir)
    rows, dropped = generate("products", 24, 0, None)
    assert dropped == 0 and all(r["extra_info"]["tool_calls"] == 1 for r in rows)
    train = write_rows(rows[:16], str(tmp_path / "data" / "train.parquet"))
    test = write_rows(rows[16:], str(tmp_path / "data" / "test.parquet"))
    ckpt = tmp_path / "sft"

    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
         "hybridrl.trainer.main_sft", f"data.train_files={train}", f"data.val_files={test}", f"model.path={model_dir}",
         "data.train_batch_size=8", "data.micro_batch_size_per_gpu=2", "data.max_length=128", "data.shuffle=false",
         "optim.lr=3e-3", "optim.lr_warmup_steps_ratio=0", "optim.lr_decay_style=constant", "trainer.device=cpu",
         "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2", f"trainer.default_local_dir={ckpt}",
         "trainer.logger=[console,jsonl]", "engine=megatron"], timeout=200)
    logged = [json.loads(line) for line in open(ckpt / "logs" / "metrics.jsonl")]
    assert [r["step"] for r in logged] == [1, 2]
    assert abs(logged[0]["train/loss"] - float64_nll(model_dir, tok, rows[:8])) < 1e-4
    assert logged[1]["train/loss"] < logged[0]["train/loss"]
    export = ckpt / "global_step_2" / "huggingface"
    assert abs(logged[1]["val/loss"] - float64_nll(str(export), tok, rows[16:])) < 1e-4
    assert (ckpt / "global_step_2" / "actor" / "meta.json").is_file()  # RL's checkpoint format beside it

    out = run([sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-name", "agent_demo",
               f"data.train_files={train}", f"data.val_files={test}", f"actor_rollout_ref.model.path={export}",
               "actor_rollout_ref.rollout.multi_turn.tool_config_path=configs/tools/calculator.yaml",
               f"trainer.default_local_dir={tmp_path / 'rl'}", "trainer.total_training_steps=1",
               "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.plot=false",
               "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"], timeout=240)
    assert f"hybridrl: model {export}" in out
    rl = [json.loads(line) for line in open(tmp_path / "rl" / "logs" / "metrics.jsonl")]
    assert rl[-1]["step"] == 1 and abs(rl[-1]["actor/ppo_kl"]) < 1e-6  # the actor starts where the rollout is
    assert rl[-1]["agent/turns_per_sample"] >= 1  # through the agent loop, with the calculator
