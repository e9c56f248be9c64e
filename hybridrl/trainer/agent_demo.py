"""The CPU agent demo: GRPO with a calculator tool on GSM8K-style arithmetic (two-digit products).

    python -m hybridrl.trainer.agent_demo [--out DIR] [--sft-steps N] [key=value overrides...]

1. a character tokenizer (plus the tool-call wrapper and role names as whole tokens) and problems "37*48="
   whose answer ("1776") a tiny model cannot compute but can copy from the calculator's answer;
2. a tiny Llama warmed up on a mix of conversations: some call the calculator and copy its result, the rest
   answer at once (mostly wrongly; 30% call it): after it, the model calls the tool on some prompts and guesses on others;
3. GRPO from configs/agent_demo.yaml with the agent loop (actor_rollout_ref.rollout.multi_turn) through the
   real stack: Ray, megatron-core over gloo, the torch engine's per-request generation, the calculator tool;
4. `agent demo: val/score A -> B, tool-call rate X -> Y` (greedy validation before and after).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time

import torch

from hybridrl.config.loader import CONFIG_DIR

from .demo import save_model, tiny_llama

DATA_SOURCE = "arithmetic_tool"
CALL_OPEN = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}</tool_call>'
ALPHABET = "0123456789*+-=\n"


def build_tokenizer(out_dir: str):
    from hybridrl.data.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(alphabet=ALPHABET, extra_tokens=(CALL_OPEN, CALL_CLOSE, "tool"))
    tok.save_pretrained(out_dir)
    return tok


def write_data(out_dir: str, n_train: int, n_test: int, seed: int) -> tuple[str, str]:
    from hybridrl.data.verl_format import make_row, write_parquet

    rng = random.Random(seed)
    paths = []
    for split, n in (("train", n_train), ("test", n_test)):
        rows = []
        for i in range(n):
            a, b = rng.randint(11, 99), rng.randint(11, 99)
            rows.append(make_row(DATA_SOURCE, f"{a}*{b}=", str(a * b), "arithmetic", split, i, expression=f"{a}*{b}"))
        paths.append(write_parquet(rows, os.path.join(out_dir, f"{split}.parquet")))
    return paths[0], paths[1]


def conversation(expression: str, answer: str, use_tool: bool, rng: random.Random) -> list[dict]:
    """A warm-up conversation: call the calculator and copy its result, or answer at once (a guess)."""
    user = {"role": "user", "content": expression + "="}
    if not use_tool:
        guess = str(int(answer) + rng.choice([0, rng.randint(-200, 200)]))
        return [user, {"role": "assistant", "content": guess}]
    return [user, {"role": "assistant", "content": CALL_OPEN + expression + CALL_CLOSE},
            {"role": "tool", "content": answer}, {"role": "assistant", "content": answer}]


def supervised_warmup(model, tok, train_file: str, steps: int, seed: int, tool_fraction: float = 0.3,
                      lr: float = 3e-3) -> float:
    """SFT on warm-up conversations; loss on the assistant turns (and their end-of-turn token) only."""
    import pyarrow.parquet as pq

    rows = pq.read_table(train_file).to_pylist()
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        convs = [conversation(r["extra_info"]["expression"], r["reward_model"]["ground_truth"],
                              rng.random() < tool_fraction, rng) for r in rng.sample(rows, min(64, len(rows)))]
        ids, mask, target = _batch([_tokens(c, tok) for c in convs], tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                      reduction="none")
        loss = (per_token * target[:, 1:].reshape(-1)).sum() / target[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def _tokens(conv: list[dict], tok) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and 1 on assistant content + its end token (as the agent loop's mask)."""
    ids, target = [], []
    for k in range(1, len(conv) + 1):
        upto = tok.apply_chat_template(conv[:k], tokenize=False, add_generation_prompt=conv[k - 1]["role"] != "assistant")
        new = tok(upto, add_special_tokens=False)["input_ids"][len(ids):]
        if conv[k - 1]["role"] == "assistant":  # its content and <|im_end|>, not the template's "\n" after it
            n = len(tok(conv[k - 1]["content"], add_special_tokens=False)["input_ids"]) + 1
            target += [1] * n + [0] * (len(new) - n)
        else:
            target += [0] * len(new)
        ids += new
    return ids, target


def _batch(seqs: list[tuple[list[int], list[int]]], pad: int):
    width = max(len(s) for s, _ in seqs)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s, _ in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in seqs])
    target = torch.tensor([t + [0] * (width - len(t)) for _, t in seqs])
    return ids, mask, target


def prepare(out: str, sft_steps: int, seed: int = 0) -> tuple[str, str, str]:
    torch.manual_seed(seed)
    data_dir, model_dir = os.path.join(out, "data"), os.path.join(out, "model")
    os.makedirs(data_dir, exist_ok=True)
    tok = build_tokenizer(os.path.join(out, "tokenizer"))
    train, test = write_data(data_dir, n_train=2048, n_test=64, seed=seed)
    model = tiny_llama(tok)
    start = time.perf_counter()
    loss = supervised_warmup(model, tok, train, sft_steps, seed)
    print(f"agent demo: supervised warm-up {sft_steps} steps in {time.perf_counter() - start:.1f}s (loss {loss:.3f})",
          flush=True)
    save_model(model, tok, model_dir)
    return model_dir, train, test


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="agent_demo_out")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--config-name", default="agent_demo")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    model_dir, train, test = prepare(out, args.sft_steps)
    from hybridrl.config.cli import load_run
    from hybridrl.trainer.ppo_trainer import run_ppo

    tools = os.path.join(CONFIG_DIR, "tools", "calculator.yaml")
    _, run = load_run(["--config-name", args.config_name, f"data.train_files={train}", f"data.val_files={test}",
                       f"actor_rollout_ref.model.path={model_dir}",
                       f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                       f"trainer.default_local_dir={os.path.join(out, 'checkpoints')}", *overrides])
    print(run.summary(), flush=True)
    result = run_ppo(run)
    before, after = result["before"], result["after"]
    print(f"agent demo: finished in {time.perf_counter() - start:.0f}s")
    print(f"agent demo: val/score {100 * before.get('val/score', float('nan')):.1f} -> "
          f"{100 * after.get('val/score', float('nan')):.1f}, tool-call rate "
          f"{100 * before.get('val/agent/tool_call_rate', float('nan')):.1f} -> "
          f"{100 * after.get('val/agent/tool_call_rate', float('nan')):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
