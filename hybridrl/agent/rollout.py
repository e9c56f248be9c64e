"""A batch of prompts through the agent loop: the same output layout as a single-turn generate.

`AgentRollout.generate(engine, prompts, sampling)` runs prompts x n samples, each its own AgentLoop
coroutine, all on one event loop, and assembles them with hybridrl.rollout.assemble (so the layout rules
stay in one place): responses [B*n, R] with tool / user turns inside, response_mask 0 on those tokens
(the loss, KL, entropy and advantages all mask by it), attention_mask 1 over the whole response, and
rollout_log_probs on generated tokens only (0 elsewhere). Per-sample counts travel as non-tensor keys
(agent_turns, agent_tool_calls) and the step's metrics under agent/.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

import numpy as np

from hybridrl.protocol import DataProto
from hybridrl.rollout.assemble import assemble_rollout
from hybridrl.rollout.base import RolloutEngine, SamplingParams
from hybridrl.rollout.sampling import row_seed

from .interaction import load_interactions
from .loop import AgentLoop, LoopSettings, SampleInputs, Trajectory
from .tools.base import load_tools


class AgentRollout:
    def __init__(self, loop: AgentLoop, pad_token_id: int) -> None:
        self.loop = loop
        self.pad_token_id = pad_token_id

    @classmethod
    def from_config(cls, multi_turn: Any, response_length: int, tokenizer: Any,
                    chat_kwargs: Optional[dict] = None) -> "AgentRollout":
        """From actor_rollout_ref.rollout.multi_turn (tools and interactions loaded from their files)."""
        m = multi_turn
        tools = load_tools(m.tool_config_path) if m.tool_config_path else {}
        interactions = load_interactions(m.interaction_config_path) if m.interaction_config_path else {}
        settings = LoopSettings(
            response_length=response_length, max_assistant_turns=m.max_assistant_turns,
            max_user_turns=m.max_user_turns, max_parallel_calls=m.max_parallel_calls,
            max_tool_response_length=m.max_tool_response_length,
            tool_response_truncate_side=m.tool_response_truncate_side, tool_timeout_s=m.tool_timeout_s,
            format=m.format)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(AgentLoop(tokenizer, settings, tools, interactions, chat_kwargs), pad)

    def generate(self, engine: RolloutEngine, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        samples = self.sample_inputs(prompts, sampling)
        start = time.perf_counter()
        trajectories = asyncio.run(self._run_all(engine, sampling, samples))
        seconds = time.perf_counter() - start
        out = assemble_rollout(
            prompts, [t.response_ids for t in trajectories],
            [t.log_probs for t in trajectories] if sampling.logprobs else None, n=sampling.n,
            max_tokens=self.loop.s.response_length, pad_token_id=self.pad_token_id,
            loss_masks=[t.loss_mask for t in trajectories])
        out.non_tensor_batch["agent_turns"] = np.array([t.assistant_turns for t in trajectories], dtype=np.int64)
        out.non_tensor_batch["agent_tool_calls"] = np.array([t.tool_calls for t in trajectories], dtype=np.int64)
        out.meta_info["metrics"] = {**agent_metrics(trajectories), "timing_s/agent_loop": seconds}
        return out

    async def _run_all(self, engine: RolloutEngine, sampling: SamplingParams,
                       samples: list[SampleInputs]) -> list[Trajectory]:
        return list(await asyncio.gather(*(self.loop.run(engine, sampling, s) for s in samples)))

    def sample_inputs(self, prompts: DataProto, sampling: SamplingParams) -> list[SampleInputs]:
        """prompts x n, each prompt's samples adjacent (the rollout contract's order), with distinct seeds."""
        ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu()
        raw = prompts.non_tensor_batch.get("raw_prompt")
        extra = prompts.non_tensor_batch.get("extra_info")
        base = sampling.seed if sampling.seed is not None else int(time.time_ns())
        out = []
        for i in range(len(prompts)):
            prompt_ids = ids[i][mask[i].bool()].tolist()
            messages = list(raw[i]) if raw is not None else \
                [{"role": "user", "content": self.loop.tokenizer.decode(prompt_ids, skip_special_tokens=True)}]
            info = extra[i] if extra is not None and isinstance(extra[i], dict) else {}
            for j in range(sampling.n):
                row = i * sampling.n + j
                out.append(SampleInputs(prompt_ids, messages, row_seed(base, row), dict(info.get("tools_kwargs") or {}),
                                        dict(info.get("interaction_kwargs") or {})))
        return out


def agent_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Per-step means over samples (verl-like names under agent/)."""
    n = max(len(trajectories), 1)
    calls = sum(t.tool_calls for t in trajectories)
    obs_tokens = sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajectories)
    finishes: dict[str, int] = {}
    for t in trajectories:
        finishes[t.finish] = finishes.get(t.finish, 0) + 1
    metrics = {
        "agent/turns_per_sample": sum(t.assistant_turns for t in trajectories) / n,
        "agent/user_turns_per_sample": sum(t.user_turns for t in trajectories) / n,
        "agent/tool_calls_per_sample": calls / n,
        "agent/tool_call_rate": sum(t.tool_calls > 0 for t in trajectories) / n,
        "agent/tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "agent/tool_timeouts": float(sum(t.tool_timeouts for t in trajectories)),
        "agent/tool_seconds": sum(t.tool_seconds for t in trajectories),
        "agent/tool_seconds_per_call": sum(t.tool_seconds for t in trajectories) / max(calls, 1),
        "agent/observation_tokens_per_sample": obs_tokens / n,
        "agent/tool_reward_mean": sum(t.tool_reward for t in trajectories) / n,
    }
    metrics.update({f"agent/finish_{k}_fraction": v / n for k, v in sorted(finishes.items())})
    return metrics
