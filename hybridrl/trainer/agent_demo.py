"""The CPU agent demo: GRPO with a calculator tool on GSM8K-style arithmetic (two-digit products).

    python -m hybridrl.trainer.agent_demo [--out DIR] [--sft-steps N] [--seed S] [key=value overrides...]

1. a character tokenizer (plus the tool-call wrapper and role names as whole tokens) and problems "37*48="
   whose answer ("1776") a tiny model cannot compute but can copy from the calculator's answer;
2. a tiny Llama warmed up (500 SFT steps) on a mix of conversations: some call the calculator and copy its
   result, the rest answer at once (a guess: the product or a number near it, mostly wrong from the model).
   Half of them call it for the first 70% of the steps, so that the copying is learned; 15% afterwards, so
   that the model starts RL knowing how to use the tool but rarely choosing to (greedy validation: ~0% tool
   calls, a few % right);
3. GRPO from configs/agent_demo.yaml with the agent loop (actor_rollout_ref.rollout.multi_turn) through the
   real stack: Ray, megatron-core over gloo, the torch engine's per-request generation, the calculator tool.
   The sampled tool calls (~10% at first) are the only reliably right answers, so the policy learns to call;
4. `agent demo: val/score A -> B, tool-call rate X -> Y` (greedy validation before and after): 1.6 -> 100.0 and
   0 -> 100 in 75 s on 2 busy cores (2026-11-25; --seed 1/2 data.seed=2/3: 7.8 -> 100.0 and 0.0 -> 98.4).
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import torch

from hybridrl.config.loader import CONFIG_DIR
from hybridrl.utils.out_dir import OutputDirError, claim

from .demo import ENTRIES, save_model, tiny_llama

DATA_SOURCE = "arithmetic_tool"
CALL_OPEN = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}</tool_call>'
ALPHABET = "0123456789*+-=\n"
OWNER = "hybridrl.trainer.agent_demo"  # the marker in --out that proves this demo made the folder


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


def supervised_warmup(model, tok, train_file: str, steps: int, seed: int,
                      phases: tuple[tuple[float, float], ...] = ((0.7, 0.5), (1.0, 0.15)), lr: float = 3e-3
                      ) -> tuple[float, float]:
    """SFT on warm-up conversations; loss on the assistant turns (and their end-of-turn token) only.

    phases: (end as a fraction of the steps, share of conversations that call the calculator). Copying the
    expression into the call and the tool's result into the answer is an induction-style skill that a 2-layer
    model only picks up from many examples (with 30% tool conversations for 300 steps it copies ~1 answer in
    20), so the first phase calls the tool in half of them; the last phase mostly guesses, so that the
    model starts RL knowing how to use the calculator but rarely choosing to (greedy: almost never).
    Returns the last step's loss and the loss on its tool conversations alone (mostly the copies: near 0
    once they are learned; the guesses keep the overall loss near 1).
    """
    import pyarrow.parquet as pq

    rows = pq.read_table(train_file).to_pylist()
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    warm = max(1, steps // 20)  # without a ramp and clipping, lr 3e-3 sometimes diverges in the first steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
                                              0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    loss = tool_loss = torch.tensor(float("nan"))
    # rows come back (a tool conversation, or a guess equal to the answer, is the same every time): rendering and
    # tokenizing each prefix again was half of the warm-up's time
    tokens: dict[tuple, tuple[list[int], list[int]]] = {}
    for step in range(steps):
        tool_fraction = next((f for end, f in phases if step < end * steps), phases[-1][1])
        batch = rng.sample(rows, min(64, len(rows)))
        use_tool = torch.tensor([rng.random() < tool_fraction for _ in batch])
        convs = [conversation(r["extra_info"]["expression"], r["reward_model"]["ground_truth"], bool(t), rng)
                 for r, t in zip(batch, use_tool)]
        keys = [tuple((m["role"], m["content"]) for m in c) for c in convs]
        for key, c in zip(keys, convs):
            if key not in tokens:
                tokens[key] = _tokens(c, tok)
        ids, mask, target = _batch([tokens[k] for k in keys], tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        target = target[:, 1:]
        loss = (per_token * target).sum() / target.sum()
        tool_loss = (per_token[use_tool] * target[use_tool]).sum() / target[use_tool].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return float(loss.detach()), float(tool_loss.detach())


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
    threads = torch.get_num_threads()
    # One thread: the model is too small to gain from two, and on a busy machine torch's 2-thread kernels
    # ran the warm-up 10x slower (100 steps: 60-74 s vs 5.5 s single-threaded, 2 shared cores)
    torch.set_num_threads(1)
    try:
        loss, tool_loss = supervised_warmup(model, tok, train, sft_steps, seed)
    finally:
        torch.set_num_threads(threads)
    print(f"agent demo: supervised warm-up {sft_steps} steps in {time.perf_counter() - start:.1f}s (loss {loss:.3f}, "
          f"on the tool conversations {tool_loss:.3f})", flush=True)
    save_model(model, tok, model_dir)
    return model_dir, train, test


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="agent_demo_out")
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0, help="seed of the problems, the initial model and the warm-up "
                        "(GRPO's own: data.seed=N)")
    parser.add_argument("--config-name", default="agent_demo")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    from hybridrl.config.cli import load_run, user_errors

    tools = os.path.join(CONFIG_DIR, "tools", "calculator.yaml")
    # the overrides are checked before anything is written (prepare() names these same paths)
    _, run = load_run(["--config-name", args.config_name, f"data.train_files={os.path.join(out, 'data', 'train.parquet')}",
                       f"data.val_files={os.path.join(out, 'data', 'test.parquet')}",
                       f"actor_rollout_ref.model.path={os.path.join(out, 'model')}",
                       f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                       f"trainer.default_local_dir={os.path.join(out, 'checkpoints')}", *overrides])
    try:
        claim(out, OWNER, ENTRIES, fresh=True)
    except OutputDirError as e:
        print(f"agent demo: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    prepare(out, args.sft_steps, args.seed)
    from hybridrl.trainer.checkpoint_manager import CheckpointError
    from hybridrl.trainer.ppo_trainer import run_ppo
    from hybridrl.trainer.stopping import exit_when_stopped

    print(run.summary(), flush=True)
    with user_errors("agent demo", also=(CheckpointError,)), exit_when_stopped(run.cfg.trainer):
        result = run_ppo(run)
    if result.get("finished") or result.get("stopped_by"):
        return 128 + result["stopped_by"] if result.get("stopped_by") else 0
    before, after = result["before"], result["after"]
    print(f"agent demo: finished in {time.perf_counter() - start:.0f}s")
    print(f"agent demo: val/score {100 * before.get('val/score', float('nan')):.1f} -> "
          f"{100 * after.get('val/score', float('nan')):.1f}, tool-call rate "
          f"{100 * before.get('val/agent/tool_call_rate', float('nan')):.1f} -> "
          f"{100 * after.get('val/agent/tool_call_rate', float('nan')):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
