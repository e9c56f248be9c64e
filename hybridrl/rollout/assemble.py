"""Turn per-sample generated tokens into the output batch of the rollout contract (see base.py).

Every engine ends its `generate` here, so the layout rules (left-padded prompts, right-padded
responses, interleaved samples, position ids, masks) live in one place and the vLLM and torch engines
cannot drift apart. Pure function: no model, no engine state.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from hybridrl.protocol import DataProto

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def assemble_rollout(
    prompts: DataProto,
    responses: Sequence[Sequence[int]],
    logprobs: Optional[Sequence[Optional[Sequence[float]]]],
    *,
    n: int,
    max_tokens: int,
    pad_token_id: int,
    routed_experts: Optional[torch.Tensor] = None,
    loss_masks: Optional[Sequence[Sequence[int]]] = None,
) -> DataProto:
    """Output batch of B*n rows from B prompts and B*n generated token lists.

    responses[i*n + j] is sample j of prompt i: its generated tokens, ending with the stop token when
    one was hit (the stop token is part of the response and of response_mask). logprobs[k] gives the
    per-token log-probs of responses[k] (same length); None (for all or one sample) means zeros.
    routed_experts (MoE engines asked to record routing): [B*n, P + max_tokens, layers, k] expert ids of
    every token the engine ran, in the output's input_ids layout, -1 where unknown; kept as int16 with -1
    outside the attention mask (padding, and the last response token, which no forward pass routes).
    loss_masks (multi-turn rollouts): per response, 1 on the tokens the policy generated and 0 on the tokens
    appended for it (tool and user turns); they become response_mask, with holes, while attention_mask stays 1
    over the whole response. Default: every response token was generated.
    """
    _check_inputs(prompts, responses, logprobs, n, max_tokens)
    if loss_masks is not None:
        if len(loss_masks) != len(responses) or any(len(m) != len(t) for m, t in zip(loss_masks, responses)):
            raise ValueError("assemble_rollout: loss_masks must give one 0/1 value per response token")
    rows = len(responses)
    response_ids = torch.full((rows, max_tokens), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, max_tokens), dtype=torch.long)
    attended = torch.zeros((rows, max_tokens), dtype=torch.long)
    rollout_log_probs = torch.zeros((rows, max_tokens), dtype=torch.float32)
    for k, tokens in enumerate(responses):
        length = len(tokens)
        if length == 0:
            continue
        response_ids[k, :length] = torch.as_tensor(list(tokens), dtype=torch.long)
        attended[k, :length] = 1
        response_mask[k, :length] = 1 if loss_masks is None else torch.as_tensor(list(loss_masks[k]), dtype=torch.long)
        if logprobs is not None and logprobs[k] is not None:
            rollout_log_probs[k, :length] = torch.as_tensor(list(logprobs[k]), dtype=torch.float32)

    repeated = prompts.repeat(n, interleave=True)
    prompt_ids = repeated.batch["input_ids"]
    prompt_mask = repeated.batch["attention_mask"]
    prompt_pos = repeated.batch["position_ids"]
    response_pos = _continue_positions(prompt_pos, max_tokens)
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids.to(prompt_ids.device),
        "input_ids": torch.cat([prompt_ids, response_ids.to(prompt_ids.device)], dim=-1),
        "attention_mask": torch.cat([prompt_mask, attended.to(prompt_mask.device, prompt_mask.dtype)], dim=-1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=-1),
        "response_mask": response_mask.to(prompt_ids.device),
        "rollout_log_probs": rollout_log_probs.to(prompt_ids.device),
    }
    if routed_experts is not None:
        routed = routed_experts.to(torch.int16).clone()
        routed[~tensors["attention_mask"].bool().to(routed.device)] = -1
        tensors["routed_experts"] = routed.to(prompt_ids.device)
    return DataProto(tensors, dict(repeated.non_tensor_batch), dict(prompts.meta_info))


def _continue_positions(prompt_pos: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Response position ids: the prompt's last position + 1, + 2, ... (also over response padding,
    as verl does; padding is masked out anyway). Works for [B, P] and multi-axis [B, A, P] ids."""
    delta = torch.arange(1, max_tokens + 1, dtype=prompt_pos.dtype, device=prompt_pos.device)
    return prompt_pos[..., -1:] + delta


def _check_inputs(
    prompts: DataProto,
    responses: Sequence[Sequence[int]],
    logprobs: Optional[Sequence[Optional[Sequence[float]]]],
    n: int,
    max_tokens: int,
) -> None:
    missing = [k for k in PROMPT_KEYS if k not in prompts.batch]
    if missing:
        raise KeyError(f"assemble_rollout: the prompt batch lacks {missing}; a rollout input needs {list(PROMPT_KEYS)}")
    if n < 1:
        raise ValueError(f"assemble_rollout: n={n} must be >= 1")
    if len(responses) != len(prompts) * n:
        raise ValueError(f"assemble_rollout: {len(responses)} responses for {len(prompts)} prompts x n={n}; "
                         f"expected {len(prompts) * n} (each prompt's n samples adjacent)")
    if logprobs is not None and len(logprobs) != len(responses):
        raise ValueError(f"assemble_rollout: {len(logprobs)} log-prob lists for {len(responses)} responses")
    for k, tokens in enumerate(responses):
        if len(tokens) > max_tokens:
            raise ValueError(f"assemble_rollout: response {k} has {len(tokens)} tokens, more than max_tokens={max_tokens}")
        if logprobs is not None and logprobs[k] is not None and len(logprobs[k]) != len(tokens):
            raise ValueError(f"assemble_rollout: response {k} has {len(tokens)} tokens but {len(logprobs[k])} log-probs")
