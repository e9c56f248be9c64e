"""Agent-loop rollout on vLLM (GPU): multi-turn with the calculator vs single-turn, same engine, same prompts.

    python benchmarks/agent_bench.py --model-dir /tmp/smol_hf --out benchmarks/results/agent_loop.json
    python benchmarks/agent_bench.py --tiny --out /tmp/agent_smoke.json      # random tiny Llama (tests/gpu)

The engine is the colocated VLLMRolloutEngine (in-process, sleep mode), driven per request by the agent loop
(hybridrl.rollout.vllm_requests). Before each rep the engine sleeps, wakes, and gets its weights through
load_weights, as the hybrid engine's sync does. Metrics: turns_per_sample, tool_calls_per_sample, tokens/s/GPU
of the multi-turn run (generated tokens: response_mask 1) and of the single-turn engine.generate run on the same
prompts and sampling, and their ratio; the max |rollout log-prob - transformers teacher-forced log-prob| mean
over generated tokens of the multi-turn sequences (tool tokens in context) as a correctness check.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CALCULATOR = os.path.join(ROOT, "configs", "tools", "calculator.yaml")


def prompts_for(tok, count: int, seed: int):
    """Arithmetic word problems, rendered as the trainer renders them with data.tool_config_path set: the
    calculator's schema through the chat template, or in the system message where the template ignores tools."""
    from hybridrl.agent.tool_prompt import load_tool_prompt
    from hybridrl.data.prompt import left_pad, position_ids_from_mask
    from hybridrl.protocol import DataProto

    tools = load_tool_prompt(CALCULATOR, tok)
    rng = random.Random(seed)
    rows, raws = [], []
    for _ in range(count):
        a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(2, 9)
        msgs = [{"role": "user", "content": f"A shop sells {a} boxes with {b} pens each and {c} more pens. "
                                            "How many pens are there? Use the calculator."}]
        rows.append(tools.render(msgs))
        raws.append(msgs)
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in rows]
    width = max(map(len, ids))
    padded = [left_pad(i, width, tok.pad_token_id) for i in ids]
    input_ids = torch.stack([p[0] for p in padded])
    mask = torch.stack([p[1] for p in padded])
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask,
                                "position_ids": torch.stack([position_ids_from_mask(m) for m in mask])},
                               {"raw_prompt": raws})


def tiny_model(out_dir: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridrl.data.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def teacher_gap(model, out, rows: int = 8) -> float:
    """Mean |rollout log-prob - teacher-forced log-prob| over generated tokens (temperature 1, no top-k/p).
    A few rows per forward: the whole batch's fp32 logits would not fit beside the engine."""
    r = out.batch["responses"].shape[1]
    total, count = 0.0, 0
    for i in range(0, out.batch["input_ids"].shape[0], rows):
        b = {k: out.batch[k][i:i + rows].cuda() for k in ("input_ids", "attention_mask", "position_ids", "responses",
                                                           "response_mask", "rollout_log_probs")}
        with torch.no_grad():
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                           position_ids=b["position_ids"]).logits[:, -r - 1:-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None])[..., 0]
        mask = b["response_mask"].bool()
        total += float((b["rollout_log_probs"][mask] - lp[mask]).abs().sum())
        count += int(mask.sum())
    return total / max(count, 1)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default=None)
    p.add_argument("--tiny", action="store_true", help="a random tiny Llama (smoke test: interactions force turns)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--response-length", type=int, default=512)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gpu-util", type=float, default=0.4)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--user-turns", action="store_true",
                   help="a user turn ('go on') after each answer, up to max_user_turns: multi-turn without tool use")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from hybridrl.utils.net import free_port

    port = free_port("127.0.0.1")  # vLLM's external launcher reads a torch.distributed world: rank 0 of 1
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port)).items():
        os.environ.setdefault(k, v)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.agent import AgentLoop, AgentRollout, BaseInteraction, LoopSettings, load_tools
    from hybridrl.rollout.base import SamplingParams, eos_token_ids
    from hybridrl.rollout.vllm_engine import VLLMRolloutEngine

    model_dir = tiny_model("/tmp/agent_tiny") if args.tiny else args.model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    engine = VLLMRolloutEngine(model_dir, tp_size=1, gpu_memory_utilization=args.gpu_util, enforce_eager=args.eager,
                               max_model_len=1024 + args.response_length, pad_token_id=tok.pad_token_id,
                               eos_token_ids=eos_token_ids(tok, hf.config), load_format="dummy")
    tools = load_tools(CALCULATOR)

    class Echo(BaseInteraction):  # the tiny model never calls tools: user turns make the turns happen
        async def generate_response(self, instance_id, messages, **kw):
            return False, "go on", 0.0, {}

    interactions = {"echo": Echo({})} if args.tiny or args.user_turns else {}
    settings = LoopSettings(response_length=args.response_length, max_assistant_turns=4, max_user_turns=2,
                            tool_timeout_s=10)
    agent = AgentRollout(AgentLoop(tok, settings, tools, interactions), tok.pad_token_id)
    prompts = prompts_for(tok, args.prompts, seed=0)
    stops = tuple(range(10, 60)) if args.tiny else ()  # tiny: short turns
    results = {"multi": [], "single": []}
    gaps = []
    for rep in range(args.reps):
        sampling = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_length, seed=rep,
                                  stop_token_ids=stops)
        for mode in ("multi", "single"):
            engine.sleep()
            engine.wake_up(["weights"])
            engine.load_weights(hf.state_dict().items())  # what the hybrid engine's sync does
            engine.finish_weight_sync()
            engine.wake_up(["kv_cache"])
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = agent.generate(engine, prompts, sampling) if mode == "multi" else engine.generate(prompts, sampling)
            seconds = time.perf_counter() - start
            gen = float(out.batch["response_mask"].sum())
            m = out.meta_info.get("metrics", {})
            results[mode].append({"seconds": seconds, "gen_tokens": gen, "tokens_per_s": gen / seconds, **m})
            if mode == "multi":
                gaps.append(teacher_gap(hf, out))
    multi = results["multi"][1:] or results["multi"]  # the first rep warms up
    single = results["single"][1:] or results["single"]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    metrics = {
        "turns_per_sample": mean(multi, "agent/turns_per_sample"),
        "tool_calls_per_sample": mean(multi, "agent/tool_calls_per_sample"),
        "user_turns_per_sample": mean(multi, "agent/user_turns_per_sample"),
        "tool_errors_per_rep": mean(multi, "agent/tool_errors"),
        "multi_turn_tokens_per_s_per_gpu": mean(multi, "tokens_per_s"),
        "single_turn_tokens_per_s_per_gpu": mean(single, "tokens_per_s"),
        "engine_steps_per_rep": float(engine._requests.steps) / args.reps if engine._requests else 0.0,
        "rollout_vs_hf_logprob_abs_diff_mean": max(gaps),
    }
    metrics["multi_vs_single_tokens_per_s"] = metrics["multi_turn_tokens_per_s_per_gpu"] / \
        metrics["single_turn_tokens_per_s_per_gpu"]
    report = {"command": " ".join(["python", "benchmarks/agent_bench.py", *(argv or sys.argv[1:])]),
              "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "metrics": metrics,
              "reps": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(metrics, indent=1), flush=True)
    return report


if __name__ == "__main__":
    main()
