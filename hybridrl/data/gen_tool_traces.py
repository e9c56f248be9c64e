"""Synthetic tool-call traces of the calculator task, for SFT before agent RL (verl's multi-turn SFT format).

    python -m hybridrl.data.gen_tool_traces --task gsm_symbolic --out_dir ~/data/calc_traces --train 2000 --test 100
    python -m hybridrl.data.gen_tool_traces --task products --out_dir /tmp/traces --train 256 --no_tools_column

Each row is a conversation in verl's multi-turn SFT format, `messages` (user, then assistant turns that call the
calculator with OpenAI-style `tool_calls`, `tool` turns holding the calculator's answer, and a last assistant
turn with the answer) and `tools` (the calculator's schema from the tool file RL uses, so the SFT prompt declares
the tool exactly as RL's prompts do), plus RL's columns (data_source, prompt, reward_model, extra_info), so
the same rows score with RL's reward. Every tool turn holds what the calculator returns for that call, and the
answer is the ground truth (rows where either fails are dropped and counted).

Tasks (the calculator tasks of the agent loop):
- gsm_symbolic: reasoning-gym's GSM8K-style word problems (the GPU run's data, hybridrl.data.gen_gsm_symbolic),
  the user turn is the RL prompt (question + GSM8K's instruction); each line of the worked solution that states
  `expression = value` becomes an assistant turn calling the calculator with that expression, and the answer
  ends with "#### N" (the gsm8k scorer's format).
- products: two-digit products "37*48=" (the CPU agent demo's task): one call, then the bare answer.
--direct_fraction F writes that share of rows without tool calls (the worked solution as text, or the answer).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
from typing import Any, Optional

from hybridrl.agent.tools.calculator import CalculatorError, evaluate, format_number

__all__ = ["calculator_steps", "gsm_symbolic_trace", "product_trace", "generate", "main"]

DEFAULT_TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tools", "calculator.yaml")
_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
_EQUATION = re.compile(rf"=\s*[^\d\s]{{0,3}}\s*({_NUM})")
_TOKEN = re.compile(rf"{_NUM}|[-+*/×x÷()]")


def tool_call(expression: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}


def _expression(lhs: str, value: float) -> Optional[str]:
    """The arithmetic of `lhs` that gives `value`: numbers and operators in order, unit slashes ("days/week")
    dropped, the longest tail of them that evaluates to `value`."""
    lhs = re.sub(r"/\s*[A-Za-z]", " ", lhs)  # "£195/day": a unit, not a division
    tokens = []
    for m in _TOKEN.finditer(lhs):
        tok = m.group(0)
        if tok in "x×":
            tok = "*" if tokens and tokens[-1] not in "+-*/(" else ""
        tok = {"÷": "/"}.get(tok, tok).replace(",", "")
        if tok:
            tokens.append(tok)
    for start in range(len(tokens)):
        expr = "".join(tokens[start:])
        if not re.search(r"\d[-+*/]", expr):
            continue
        try:
            if abs(float(evaluate(expr)) - value) < 1e-6 * max(1.0, abs(value)):
                return expr
        except CalculatorError:
            continue
    return None


def calculator_steps(cot: str) -> list[tuple[str, str, str, str]]:
    """(text before "=", expression, the calculator's answer, text after the value) of each solution line that
    states `arithmetic = value` and whose arithmetic gives that value."""
    steps = []
    for line in cot.splitlines():
        if line.startswith("####"):
            continue
        eq = None
        for m in _EQUATION.finditer(line):
            eq = m
        if eq is None:
            continue
        value = float(eq.group(1).replace(",", ""))
        expr = _expression(line[:eq.start()], value)
        if expr is not None:
            answer = format_number(evaluate(expr))
            steps.append((line[:eq.start()].rstrip(), expr, answer, line[eq.end():]))
    return steps


def gsm_symbolic_trace(question_prompt: str, cot: str, truth: str, use_tools: bool) -> Optional[list[dict]]:
    """The conversation of one worked solution (None when no line of it is calculator arithmetic)."""
    user = {"role": "user", "content": question_prompt}
    final = cot[: cot.rfind("####")].rstrip() if "####" in cot else cot.rstrip()
    if not use_tools:
        return [user, {"role": "assistant", "content": f"{final}\n#### {truth}"}]
    steps = calculator_steps(cot)
    if not steps:
        return None
    messages, carry = [user], ""
    for before, expr, answer, after in steps:
        messages.append({"role": "assistant", "content": (carry + before).strip(), "tool_calls": [tool_call(expr)]})
        messages.append({"role": "tool", "content": answer})
        carry = f"That is {answer}{after}\n"
    messages.append({"role": "assistant", "content": f"{carry}#### {truth}"})
    return messages


def product_trace(expression: str, answer: str, use_tools: bool) -> list[dict]:
    user = {"role": "user", "content": expression + "="}
    if not use_tools:
        return [user, {"role": "assistant", "content": answer}]
    return [user, {"role": "assistant", "content": "", "tool_calls": [tool_call(expression)]},
            {"role": "tool", "content": format_number(evaluate(expression))}, {"role": "assistant", "content": answer}]


def check_trace(messages: list[dict], truth: str) -> bool:
    """Every tool turn holds the calculator's answer to the call before it; the last turn ends with the truth."""
    pending: Optional[str] = None
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            pending = format_number(evaluate(m["tool_calls"][0]["function"]["arguments"]["expression"]))
        elif m["role"] == "tool":
            if m["content"] != pending:
                return False
            pending = None
    last = messages[-1]
    return last["role"] == "assistant" and not last.get("tool_calls") and last["content"].rstrip().endswith(truth)


def _rl_rows(task: str, n: int, seed: int) -> list[dict[str, Any]]:
    """RL rows of the task (prompt, reward_model, extra_info, ...): the same rows RL trains on."""
    if task == "gsm_symbolic":
        from .gen_gsm_symbolic import generate_rows

        return generate_rows(n, 0, seed)["train"]
    from .verl_format import make_row

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        rows.append(make_row("arithmetic_tool", f"{a}*{b}=", str(a * b), "arithmetic", "train", i,
                             expression=f"{a}*{b}"))
    return rows


def generate(task: str, n: int, seed: int, tools: Optional[list[dict]], direct_fraction: float = 0.0
             ) -> tuple[list[dict[str, Any]], int]:
    """(rows with messages [+ tools], rows dropped) for n problems of `task`."""
    if task not in ("gsm_symbolic", "products"):
        raise ValueError(f"--task {task!r}: expected gsm_symbolic or products")
    rng = random.Random(seed + 1)
    out, dropped = [], 0
    for row in _rl_rows(task, n, seed):
        truth = row["reward_model"]["ground_truth"]
        use_tools = rng.random() >= direct_fraction
        if task == "gsm_symbolic":
            messages = gsm_symbolic_trace(row["prompt"][0]["content"], row["extra_info"]["answer"], truth, use_tools)
        else:
            messages = product_trace(row["extra_info"]["expression"], truth, use_tools)
        if messages is None or not check_trace(messages, truth):
            dropped += 1
            continue
        row = {**row, "messages": messages, "extra_info": {**row["extra_info"], "tool_calls": sum(
            len(m.get("tool_calls") or []) for m in messages)}}
        if tools:
            row["tools"] = tools
        out.append(row)
    return out, dropped


def write_rows(rows: list[dict[str, Any]], path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if path.endswith(".jsonl"):
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def tool_schemas(path: str) -> list[dict]:
    from hybridrl.agent.tools.base import load_tools

    return [tool.get_openai_tool_schema() for tool in load_tools(path).values()]


def main(argv: Optional[list[str]] = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description="synthetic calculator tool-call traces (verl multi-turn SFT format)")
    p.add_argument("--task", default="gsm_symbolic", choices=["gsm_symbolic", "products"])
    p.add_argument("--out_dir", required=True)
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--test", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", default="parquet", choices=["parquet", "jsonl"])
    p.add_argument("--tool_config", default=os.path.normpath(DEFAULT_TOOLS),
                   help="the verl tool file RL uses (its schemas go into the `tools` column)")
    p.add_argument("--no_tools_column", action="store_true", help="no `tools` column (prompts without the schemas)")
    p.add_argument("--direct_fraction", type=float, default=0.0, help="share of rows answered without the tool")
    args = p.parse_args(argv)
    tools = None if args.no_tools_column else tool_schemas(args.tool_config)
    rows, dropped = generate(args.task, args.train + args.test, args.seed, tools, args.direct_fraction)
    written = {}
    for split, part in (("train", rows[:args.train]), ("test", rows[args.train:])):
        if part:
            written[split] = write_rows(part, os.path.join(args.out_dir, f"{split}.{args.format}"))
            calls = sum(r["extra_info"]["tool_calls"] for r in part) / len(part)
            print(f"{split}: {len(part)} conversations ({calls:.2f} calculator calls each) -> {written[split]}")
    if dropped:
        print(f"dropped {dropped} of {args.train + args.test} problems (no calculator arithmetic in the solution)")
    return written


if __name__ == "__main__":
    main()
