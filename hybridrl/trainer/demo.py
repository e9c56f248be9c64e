"""`make demo`: train a tiny model on CPU through the whole stack and show that GRPO improves it.

1. a character tokenizer and synthetic arithmetic prompts ("3+4=" -> "7"), written as verl parquet;
2. a tiny Llama-shaped model, randomly initialized, warmed up briefly with supervised steps (plain
   torch, a few seconds: enough to learn the answer format, not the sums);
3. GRPO from configs/demo.yaml through main_ppo's path: Ray, megatron-core over gloo, the torch engine;
4. `demo: val/score BEFORE -> AFTER` (greedy accuracy on the test prompts, in percent), the metrics
   table and a plot.

    python -m hybridrl.trainer.demo [--out DIR] [--sft-steps N] [--config-name NAME] [key=value overrides...]

--config-name dapo_demo runs DAPO (dynamic sampling, overlong buffer, clip-higher) instead of GRPO.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

from hybridrl.utils.out_dir import OutputDirError, claim

DEMO_ALPHABET = "0123456789+="
OWNER = "hybridrl.trainer.demo"  # the marker in --out that proves the demo made the folder
ENTRIES = ("data", "model", "tokenizer", "checkpoints")  # what a fresh run replaces in it, nothing else


def build_tokenizer(out_dir: str):
    from hybridrl.data.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(alphabet=DEMO_ALPHABET)
    tok.save_pretrained(out_dir)
    return tok


def write_data(out_dir: str, n_train: int, n_test: int, seed: int) -> tuple[str, str]:
    from hybridrl.data.arithmetic import generate_rows
    from hybridrl.data.verl_format import write_parquet

    rows = generate_rows(n_train, n_test, seed)
    return (write_parquet(rows["train"], os.path.join(out_dir, "train.parquet")),
            write_parquet(rows["test"], os.path.join(out_dir, "test.parquet")))


def tiny_llama(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def supervised_warmup(model, tokenizer, train_file: str, steps: int, seed: int, lr: float = 3e-3) -> float:
    """A few SFT steps on (prompt, answer) pairs; loss on the answer and its end-of-turn token only."""
    import pyarrow.parquet as pq

    rows = pq.read_table(train_file).to_pylist()
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        batch = rng.sample(rows, min(64, len(rows)))
        ids, mask, target = _sft_batch(batch, tokenizer)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                      reduction="none")
        loss = (per_token * target[:, 1:].reshape(-1)).sum() / target[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def _sft_batch(rows: list[dict], tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs, targets = [], []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(row["reward_model"]["ground_truth"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        targets.append([0] * len(p) + [1] * len(a))
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    target = torch.tensor([t + [0] * (width - len(t)) for t in targets])
    return ids, mask, target


def save_model(model, tokenizer, out_dir: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    model.config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def prepare(out: str, sft_steps: int, seed: int = 0) -> tuple[str, str, str]:
    """Data and the warmed-up model under `out`; returns (model_dir, train_file, test_file)."""
    torch.manual_seed(seed)
    data_dir, model_dir = os.path.join(out, "data"), os.path.join(out, "model")
    os.makedirs(data_dir, exist_ok=True)
    tokenizer = build_tokenizer(os.path.join(out, "tokenizer"))
    train, test = write_data(data_dir, n_train=2048, n_test=128, seed=seed)
    model = tiny_llama(tokenizer)
    start = time.perf_counter()
    loss = supervised_warmup(model, tokenizer, train, sft_steps, seed)
    print(f"demo: supervised warm-up {sft_steps} steps in {time.perf_counter() - start:.1f}s (loss {loss:.3f})",
          flush=True)
    save_model(model, tokenizer, model_dir)
    return model_dir, train, test


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo_out")
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--keep", action="store_true", help="keep earlier checkpoints in --out (resume)")
    parser.add_argument("--config-name", default="demo", help="demo (GRPO) or dapo_demo (DAPO), from configs/")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    from hybridrl.config.cli import load_run, user_errors

    # the overrides are checked before anything is written (prepare() names these same paths)
    _, run = load_run(["--config-name", args.config_name, f"data.train_files={os.path.join(out, 'data', 'train.parquet')}",
                       f"data.val_files={os.path.join(out, 'data', 'test.parquet')}",
                       f"actor_rollout_ref.model.path={os.path.join(out, 'model')}",
                       f"trainer.default_local_dir={os.path.join(out, 'checkpoints')}", *overrides])
    try:
        claim(out, OWNER, ENTRIES, fresh=not args.keep)
    except OutputDirError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    prepare(out, args.sft_steps)
    from hybridrl.trainer.checkpoint_manager import CheckpointError
    from hybridrl.trainer.ppo_trainer import run_ppo
    from hybridrl.trainer.stopping import exit_when_stopped

    print(run.summary(), flush=True)
    with user_errors("demo", also=(CheckpointError,)), exit_when_stopped(run.cfg.trainer):
        result = run_ppo(run)
    if result.get("finished"):
        return 0
    if result.get("stopped_by"):
        return 128 + result["stopped_by"]
    # nan where a run skipped validation (trainer.val_before_train=false or test_freq=-1)
    before, after = (result[k].get("val/score", float("nan")) for k in ("before", "after"))
    print(f"demo: finished in {time.perf_counter() - start:.0f}s")
    print(f"demo: val/score {100 * before:.1f} -> {100 * after:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
