"""The prompt token ids each trainer sends to vLLM for the same rows, dumped and compared.

    PYTHONPATH=<verl's path> python check_prompts.py --side verl --model DIR --data F.parquet --out verl.json
    PYTHONPATH=<our path>    python check_prompts.py --side ours --model DIR --data F.parquet --out ours.json \
        --compare verl.json

verl: its RLHFDataset loads the file (rows kept after filter_overlong_prompts) and the agent loop's tokenization
(verl.utils.tokenizer.chat_template.apply_chat_template, tokenize=True, add_generation_prompt=True). ours:
hybridrl's RLHFDataset (chat template text, then the tokenizer without special tokens). Exit 1 on any difference.
"""
from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace


def verl_ids(model: str, data: str, n: int, max_len: int) -> dict:
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.chat_template import apply_chat_template

    tok = hf_tokenizer(model)
    cfg = OmegaConf.create({"max_prompt_length": max_len, "filter_overlong_prompts": True, "prompt_key": "prompt",
                            "truncation": "error", "return_raw_chat": True})
    ds = RLHFDataset(data_files=[data], tokenizer=tok, config=cfg)
    ids = []
    for i in range(min(n, len(ds))):
        ids.append([int(t) for t in _flat(apply_chat_template(tok, list(ds[i]["raw_prompt"]), tokenize=True,
                                                             add_generation_prompt=True))])
    return {"rows": len(ds), "ids": ids}


def _flat(x):
    if hasattr(x, "input_ids"):
        x = x["input_ids"]
    if hasattr(x, "tolist"):
        x = x.tolist()
    return x[0] if x and isinstance(x[0], list) else x


def ours_ids(model: str, data: str, n: int, max_len: int) -> dict:
    from hybridrl.data.dataset import RLHFDataset
    from hybridrl.data.prompt import to_messages
    from hybridrl.data.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    cfg = SimpleNamespace(max_prompt_length=max_len, filter_overlong_prompts=True, prompt_key="prompt",
                          truncation="error", apply_chat_template_kwargs={})
    ds = RLHFDataset([data], tok, cfg)
    ids = []
    for rec in ds.records[:n]:
        text = ds._render(to_messages(rec["prompt"]))
        ids.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return {"rows": len(ds), "ids": ids}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", choices=["ours", "verl"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-prompt-length", type=int, default=256)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="the other side's --out file")
    args = ap.parse_args(argv)
    fn = verl_ids if args.side == "verl" else ours_ids
    got = fn(args.model, args.data, args.n, args.max_prompt_length)
    with open(args.out, "w") as f:
        json.dump(got, f)
    print(f"{args.side}: {got['rows']} rows kept, first prompt {len(got['ids'][0])} tokens")
    if args.compare:
        other = json.load(open(args.compare))
        same = sum(a == b for a, b in zip(got["ids"], other["ids"]))
        ok = same == len(got["ids"]) == len(other["ids"]) and got["rows"] == other["rows"]
        print(f"prompt ids identical on {same}/{len(got['ids'])} rows; rows kept {got['rows']} vs {other['rows']}: "
              f"{'SAME' if ok else 'DIFFERENT'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
