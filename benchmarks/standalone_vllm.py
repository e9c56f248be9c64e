"""A plain vllm.LLM in its own process, kept alive and driven over stdin/stdout, so that its timed generations
alternate with the hybrid engine's inside one run (hybrid_bench.py): both sides then see the same GPU, clocks
and lease, which separate runs did not (run-to-run spread 0.84-1.17 before).

The peer loads the weights itself (load_format auto) and generates the same prompts with the same sampling
as the hybrid side; each "go" line runs one timed generation after a prefix-cache reset and answers with one
JSON line. Protocol lines start with PREFIX; vLLM's own log lines on stdout go to the peer's log file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

PREFIX = "@@peer "


def generation_inputs(prompts: list[list[int]], max_tokens: int) -> tuple[list[dict], list[Any]]:
    """Requests as the hybrid engine sends them: token ids, per-prompt seeds, token log-probs, no detokenizing."""
    from vllm import SamplingParams

    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens, ignore_eos=True,
                             logprobs=0, detokenize=False, seed=1000 + i) for i in range(len(prompts))]
    return [{"prompt_token_ids": p} for p in prompts], params


def serve(args: argparse.Namespace) -> None:
    import torch
    from vllm import LLM

    spec = json.loads(args.spec)
    start = time.perf_counter()
    llm = LLM(model=spec["model_dir"], skip_tokenizer_init=True, dtype="bfloat16", load_format="auto",
              logprobs_mode="processed_logprobs", disable_log_stats=True, enable_sleep_mode=spec["sleep_mode"],
              **spec["engine"])
    with open(spec["prompts_file"]) as f:
        prompts = json.load(f)
    inputs, params = generation_inputs(prompts, spec["max_tokens"])
    llm.generate(inputs[:8], params[:8], use_tqdm=False)  # warm-up, as the hybrid side has
    cfg = llm.llm_engine.vllm_config
    _say({"ready": True, "startup_seconds": time.perf_counter() - start, "torch_threads": torch.get_num_threads(),
          "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
          "capture_sizes": cfg.compilation_config.cudagraph_capture_sizes,
          "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode),
          "async_scheduling": cfg.scheduler_config.async_scheduling})
    for line in sys.stdin:
        if line.strip() != "go":
            break
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        _say({"tokens": sum(len(c.token_ids) for o in outs for c in o.outputs), "seconds": seconds})


def _say(record: dict) -> None:
    print(PREFIX + json.dumps(record), flush=True)


class StandalonePeer:
    """The parent's handle: start() waits until the peer is warm; run() is one timed generation."""

    def __init__(self, name: str, model_dir: str, prompts_file: str, max_tokens: int, engine: dict,
                 sleep_mode: bool, log_path: str) -> None:
        self.name = name
        spec = dict(model_dir=model_dir, prompts_file=prompts_file, max_tokens=max_tokens, engine=engine,
                    sleep_mode=sleep_mode)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--spec", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)
        self.info = self._read(timeout_s=900)

    def run(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read(timeout_s=600)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()

    def _read(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line: Optional[str] = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"standalone peer {self.name!r} exited (rc={self.proc.poll()}); see {self.log.name}")
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
            self.log.write(line)
        raise TimeoutError(f"standalone peer {self.name!r} gave no answer in {timeout_s:.0f}s; see {self.log.name}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="internal: the standalone vLLM peer of hybrid_bench.py")
    p.add_argument("--spec", required=True)
    serve(p.parse_args())
