"""Training samples: a prompt batch generated on the rollout engine and scored. Every rollout stream draws on one
Sampler (dynamic_sampling.py, one_step_off.py, fully_async.py), so generation and scoring read the same on each path.

`version` is the number of actor updates the weights of a generation have had; the stream that launches a
generation knows it (a step's batch launched before that step's update: step - 1; one step ahead: step - 2), so
nothing here asks the trainer.
"""
from __future__ import annotations

from typing import Any, Callable, Union

from hybridrl.protocol import DataProto
from hybridrl.reward import RewardOutput

from . import batch_ops as ops
from .generation import ColocatedGeneration, SplitGeneration

Generation = Union[ColocatedGeneration, SplitGeneration]
RewardFn = Callable[[DataProto], RewardOutput]  # a reward manager, or the combined rule + model reward


class Sampler:
    def __init__(self, generation: Generation, reward_fn: RewardFn, temperature: float) -> None:
        self.generation, self.reward_fn, self.temperature = generation, reward_fn, temperature

    def prepare(self, prompts: DataProto, step: int, draw: int) -> DataProto:
        """Group ids (one per prompt, shared by its n samples) and the meta the engine reads; `draw` numbers the
        generation batches of one step (distinct sampling seeds)."""
        prompts = ops.add_group_ids(prompts)
        prompts.meta_info.update(step=step, draw=draw, validate=False)
        return prompts

    def start(self, prompts: DataProto, step: int, draw: int, version: int) -> Any:
        """Launch the generation of `step`'s samples on the weights after `version` updates; returns a handle."""
        return self.generation.start(self.prepare(prompts, step, draw), version=version)

    def finish(self, handle: Any) -> DataProto:
        """Wait for a launched generation: the samples, their metrics in meta_info["metrics"]."""
        out = self.generation.finish(handle)
        metrics = {k if "/" in k else f"rollout/{k}": v for k, v in out.meta_info["metrics"].items()}
        metrics.update(ops.agent_metrics(out.non_tensor_batch.get("agent_tool_calls"),
                                         out.non_tensor_batch.get("agent_turns")))
        # updates the policy that trains this batch has had, minus those of the policy that generated it
        metrics["async/staleness"] = float(out.meta_info["step"] - 1 - out.meta_info["weight_version"])
        out.meta_info["metrics"] = metrics
        out.meta_info["temperature"] = self.temperature
        return out

    def generate(self, prompts: DataProto, step: int, draw: int, version: int) -> DataProto:
        return self.finish(self.start(prompts, step, draw, version))

    def score(self, batch: DataProto) -> DataProto:
        """token_level_scores and the reward's per-sample extras; its metrics (reward model, judge) travel in
        meta_info["reward_metrics"] to the step's metrics."""
        result = self.reward_fn(batch)
        out = ops.with_scores(batch, result.reward_tensor, result.reward_extra_info)
        out.meta_info["reward_metrics"] = dict(result.metrics)
        return out
