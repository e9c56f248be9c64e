"""One sample's turn loop: assistant turn -> tool calls (or a user turn) -> next assistant turn.

Each sample awaits its own engine requests (RolloutEngine.generate_tokens), so samples run their loops
concurrently and a sample waiting on a tool does not hold the others back. The sample's token sequence is
the prompt, then its response: generated tokens (loss_mask 1, with their rollout log-probs) and appended
tool / user turns (loss_mask 0, log-prob 0), in order. All turns share one budget: the response never
exceeds `response_length` tokens (data.max_response_length).

The loop ends when a turn calls no tool and no interaction answers, when an assistant turn ends without a
stop token (its budget ran out), at max_assistant_turns or max_user_turns, when an interaction says so, or
when an appended turn would leave no room for another assistant token (it is then not appended, as in verl).

Tools never fail the step: a call that does not parse, names an unknown tool, raises, or runs past
tool_timeout_s becomes an "Error: ..." observation and counts as a tool error. Each call runs in its own
thread with its own event loop (tool_runner.py), so a tool that blocks (not just one that awaits forever) is
cut off too, and a stuck one never keeps the process from exiting.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Optional, Sequence

from hybridrl.rollout.base import RolloutEngine, SamplingParams
from hybridrl.rollout.sampling import row_seed

from .chat import ChatTurns
from .interaction import BaseInteraction
from .parser import ToolCall, get_parser
from .tool_runner import ToolRunner
from .tools.base import BaseTool

TRUNCATE_SIDES = ("left", "right", "middle")


@dataclass(frozen=True)
class LoopSettings:
    response_length: int  # the budget of all turns together
    max_assistant_turns: Optional[int] = None
    max_user_turns: Optional[int] = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256  # characters of one observation
    tool_response_truncate_side: str = "middle"
    tool_timeout_s: float = 30.0
    format: str = "hermes"


@dataclass
class Trajectory:
    """One sample's response and what happened in it."""

    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_seconds: float = 0.0
    tool_reward: float = 0.0
    turn_scores: list[float] = field(default_factory=list)
    finish: str = "stop"

    def add(self, ids: Sequence[int], generated: bool, log_probs: Optional[Sequence[float]] = None) -> None:
        self.response_ids += list(ids)
        self.loss_mask += [int(generated)] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)


@dataclass(frozen=True)
class SampleInputs:
    prompt_ids: list[int]
    messages: list[dict[str, Any]]  # the prompt's chat messages (for interactions)
    seed: int
    tools_kwargs: dict[str, Any] = field(default_factory=dict)  # extra_info.tools_kwargs
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)  # extra_info.interaction_kwargs


class AgentLoop:
    def __init__(self, tokenizer: Any, settings: LoopSettings, tools: dict[str, BaseTool],
                 interactions: dict[str, BaseInteraction], chat_kwargs: Optional[dict] = None,
                 max_tool_threads: int = 64) -> None:
        if settings.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"tool_response_truncate_side={settings.tool_response_truncate_side!r}: use one of "
                             f"{', '.join(TRUNCATE_SIDES)}")
        self.tokenizer = tokenizer
        self.s = settings
        self.tools = tools
        self.interactions = interactions
        self.parse = get_parser(settings.format)
        self.chat = ChatTurns(tokenizer, chat_kwargs)
        self.tool_runner = ToolRunner(max_tool_threads)

    async def run(self, engine: RolloutEngine, sampling: SamplingParams, inputs: SampleInputs) -> Trajectory:
        t = Trajectory()
        instances = await self._create_tools(inputs, t)
        interaction, inter_id = await self._start_interaction(inputs, t)
        messages = [dict(m) for m in inputs.messages]
        try:
            await self._turns(engine, sampling, inputs, t, instances, interaction, inter_id, messages)
        finally:
            await self._finish(t, instances, interaction, inter_id)
        return t

    async def _turns(self, engine: RolloutEngine, sampling: SamplingParams, inputs: SampleInputs, t: Trajectory,
                     instances: dict[str, str], interaction: Optional[BaseInteraction], inter_id: Optional[str],
                     messages: list[dict[str, Any]]) -> None:
        s = self.s
        while True:
            remaining = s.response_length - len(t.response_ids)
            if remaining <= 0:
                t.finish = "length"
                return
            turn = sampling.with_(n=1, max_tokens=remaining, seed=row_seed(inputs.seed, t.assistant_turns))
            out = await engine.generate_tokens(inputs.prompt_ids + t.response_ids, turn)
            t.add(out.token_ids, True, out.log_probs)
            t.assistant_turns += 1
            text = self.tokenizer.decode(list(out.token_ids), skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            if out.finish_reason != "stop":
                t.finish = "length"
                return
            calls = self.parse(text)[1] if self.tools else []
            if s.max_assistant_turns is not None and t.assistant_turns >= s.max_assistant_turns and (calls or interaction):
                t.finish = "max_assistant_turns"
                return
            if calls:
                new = [{"role": "tool", "content": o} for o in await self._call_tools(calls, instances, t)]
            elif interaction is not None:
                if s.max_user_turns is not None and t.user_turns >= s.max_user_turns:
                    t.finish = "max_user_turns"
                    return
                done, reply, score, _ = await self._guarded(
                    interaction.generate_response(inter_id, list(messages), **inputs.interaction_kwargs),
                    f"interaction {interaction.name!r}.generate_response")
                t.user_turns += 1
                t.turn_scores.append(float(score))
                if done:
                    t.finish = "interaction"
                    return
                new = [{"role": "user", "content": reply}]
            else:
                t.finish = "stop"
                return
            ids = self.chat.appended_ids(new)
            if len(t.response_ids) + len(ids) >= s.response_length:
                t.finish = "length"
                return
            t.add(ids, False)
            messages.extend(new)

    # ------------------------------------------------------------------ tools
    async def _call_tools(self, calls: list[ToolCall], instances: dict[str, str], t: Trajectory) -> list[str]:
        calls = calls[: self.s.max_parallel_calls]
        start = time.perf_counter()
        observations = await asyncio.gather(*(self._call_one(c, instances, t) for c in calls))
        t.tool_seconds += time.perf_counter() - start
        t.tool_calls += len(calls)
        return [self._truncate(o) for o in observations]

    async def _call_one(self, call: ToolCall, instances: dict[str, str], t: Trajectory) -> str:
        if call.error is not None:
            t.tool_errors += 1
            return f"Error: {call.error}"
        tool = self.tools.get(call.name)
        if tool is None:
            t.tool_errors += 1
            return f"Error: unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}"
        try:
            text, reward, metrics = await self._in_thread(tool.execute(instances[call.name], call.arguments))
        except asyncio.TimeoutError:
            t.tool_errors += 1
            t.tool_timeouts += 1
            return f"Error: tool {call.name!r} did not answer within {self.s.tool_timeout_s:g}s"
        except Exception as e:
            t.tool_errors += 1
            return f"Error: tool {call.name!r} failed: {type(e).__name__}: {e}"
        t.tool_reward += float(reward or 0.0)
        t.tool_errors += int(bool((metrics or {}).get("error")))
        return str(text)

    async def _in_thread(self, coro: Awaitable) -> Any:
        """Run a tool's coroutine on its own thread and event loop, at most tool_timeout_s."""
        return await self.tool_runner.run(coro, self.s.tool_timeout_s)

    async def _guarded(self, coro: Awaitable, what: str) -> Any:
        try:
            return await self._in_thread(coro)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{what} did not answer within {self.s.tool_timeout_s:g}s "
                               "(actor_rollout_ref.rollout.multi_turn.tool_timeout_s)") from None

    def _truncate(self, text: str) -> str:
        limit, side = self.s.max_tool_response_length, self.s.tool_response_truncate_side
        if len(text) <= limit:
            return text
        mark = "...(truncated)..."
        keep = max(limit - len(mark), 0)
        if side == "left":
            return mark + text[len(text) - keep:]
        if side == "right":
            return text[:keep] + mark
        return text[: keep // 2] + mark + text[len(text) - (keep - keep // 2):]

    # ------------------------------------------------------------------ lifecycle
    async def _create_tools(self, inputs: SampleInputs, t: Trajectory) -> dict[str, str]:
        instances = {}
        for name, tool in self.tools.items():
            kwargs = dict((inputs.tools_kwargs.get(name) or {}).get("create_kwargs") or {})
            instances[name] = await self._guarded(tool.create(**kwargs), f"tool {name!r}.create")
        return instances

    async def _start_interaction(self, inputs: SampleInputs, t: Trajectory
                                 ) -> tuple[Optional[BaseInteraction], Optional[str]]:
        if not self.interactions:
            return None, None
        name = inputs.interaction_kwargs.get("name")
        if name is None and len(self.interactions) == 1:
            name = next(iter(self.interactions))
        if name not in self.interactions:
            raise KeyError(f"extra_info.interaction_kwargs.name={name!r}: no such interaction in "
                           f"actor_rollout_ref.rollout.multi_turn.interaction_config_path (has {sorted(self.interactions)})")
        interaction = self.interactions[name]
        return interaction, await self._guarded(interaction.start_interaction(**inputs.interaction_kwargs),
                                                f"interaction {name!r}.start_interaction")

    async def _finish(self, t: Trajectory, instances: dict[str, str], interaction: Optional[BaseInteraction],
                      inter_id: Optional[str]) -> None:
        """Rewards and release, for every tool and interaction started, even after a failure."""
        for name, instance in instances.items():
            try:
                t.tool_reward += float(await self._in_thread(self.tools[name].calc_reward(instance)) or 0.0)
                await self._in_thread(self.tools[name].release(instance))
            except Exception:  # a tool that cannot release costs its own resources, not the step
                t.tool_errors += 1
        if interaction is not None:
            try:
                await self._in_thread(interaction.finalize_interaction(inter_id))
            except Exception:
                pass
