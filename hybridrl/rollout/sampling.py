"""Token selection for the built-in engine: logit processing, seeded per-row draws, stop conditions.

The processed distribution is the one base.py names: softmax(logits / temperature), restricted to
the top-k tokens, then to the top-p nucleus, renormalized (vLLM's order and its "processed_logprobs").
Greedy (do_sample=False or temperature 0) takes the argmax and reports log_softmax(logits), the
temperature-1 log-prob, as vLLM does at temperature 0.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from .base import SamplingParams

_MASK = 0x7FFF_FFFF_FFFF_FFFF


def processed_log_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """[b, V] log-probs of the distribution tokens are drawn from (-inf outside the top-k/top-p set)."""
    logits = logits.float()
    if sampling.greedy:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / sampling.temperature
    if sampling.top_k > 0:
        scaled = _top_k(scaled, sampling.top_k)
    if sampling.top_p < 1.0:
        scaled = _top_p(scaled, sampling.top_p)
    return torch.log_softmax(scaled, dim=-1)


def _top_k(scaled: torch.Tensor, k: int) -> torch.Tensor:
    if k >= scaled.shape[-1]:
        return scaled
    kth = torch.topk(scaled, k, dim=-1).values[..., -1:]
    return scaled.masked_fill(scaled < kth, float("-inf"))


def _top_p(scaled: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the most likely tokens until their mass reaches p (at least one token)."""
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))


def row_seed(seed: int, row: int) -> int:
    """A well-mixed 63-bit seed per (seed, row) (splitmix64), so nearby seeds share no draws."""
    z = (seed * 0x9E3779B97F4A7C15 + (row + 1) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFF_FFFF_FFFF_FFFF
    return (z ^ (z >> 31)) & _MASK


class RowSampler:
    """One torch.Generator per output row: a row's samples depend on its seed, its prompt and the
    weights only, not on which other rows share the batch or when they finished."""

    def __init__(self, sampling: SamplingParams, rows: int, seeds: Optional[Sequence[int]] = None) -> None:
        """seeds: one seed per row (per-request generation: each request brings its own); default: rows
        seeded from sampling.seed."""
        self.greedy = sampling.greedy
        self.generators: list[torch.Generator] = []
        if self.greedy:
            return
        if seeds is None:
            base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
            seeds = [row_seed(base, r) for r in range(rows)]
        if len(seeds) != rows:
            raise ValueError(f"RowSampler: {len(seeds)} seeds for {rows} rows")
        for seed in seeds:
            g = torch.Generator(device="cpu")
            g.manual_seed(int(seed) & _MASK)
            self.generators.append(g)

    def draw(self, log_probs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[b] tokens from [b, V] log-probs; `rows` are the output-row ids of the b active rows."""
        if self.greedy:
            return log_probs.argmax(dim=-1)
        u = torch.cat([torch.rand(1, generator=self.generators[int(r)]) for r in rows.tolist()])
        cdf = torch.exp(log_probs).cumsum(dim=-1)  # [b, V]
        target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
        # right=True: the first index whose cdf exceeds the target, never a zero-probability token
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
        return tokens.clamp_(max=cdf.shape[-1] - 1)


class StopChecker:
    """Per-row stop conditions: EOS (unless ignore_eos), stop_token_ids, stop strings."""

    def __init__(self, sampling: SamplingParams, eos_token_ids: Sequence[int], tokenizer: Optional[Any]) -> None:
        ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            ids.update(eos_token_ids)
        self.stop_ids = torch.tensor(sorted(ids), dtype=torch.long)
        self.stop_strings = tuple(sampling.stop)
        if self.stop_strings and tokenizer is None:
            raise ValueError("SamplingParams.stop (stop strings) needs a tokenizer: build the torch engine with "
                             "tokenizer=... or use stop_token_ids")
        self.tokenizer = tokenizer
        self._checked: dict[int, int] = {}  # row -> text length already searched
        self._longest = max((len(s) for s in self.stop_strings), default=0)

    def finished(self, tokens: torch.Tensor, rows: torch.Tensor, responses: list[list[int]]) -> torch.Tensor:
        """[b] bool: the row's newest token ends it. `responses` already include the newest tokens."""
        done = torch.isin(tokens.cpu(), self.stop_ids) if self.stop_ids.numel() else torch.zeros(len(tokens), dtype=torch.bool)
        if self.stop_strings:
            for i, r in enumerate(rows.tolist()):
                if not done[i] and self._hit_stop_string(r, responses[r]):
                    done[i] = True
        return done.to(tokens.device)

    def _hit_stop_string(self, row: int, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        # only text that could end in the newest token's characters is new; search from just before it
        start = max(0, self._checked.get(row, 0) - self._longest + 1)
        self._checked[row] = len(text)
        return any(text.find(s, start) >= 0 for s in self.stop_strings)


def _seed(base: int, step: int, replica: int, draw: int) -> int:
    seed = row_seed(row_seed(base, step), replica)
    return row_seed(seed, draw) if draw else seed  # draw 0 keeps the seeds runs had before draws existed


def sampling_from_config(rollout_cfg: Any, validate: bool = False, *, step: int = 0, replica: int = 0,
                         draw: int = 0) -> SamplingParams:
    """SamplingParams from actor_rollout_ref.rollout (validate=True: its val_kwargs).

    The seed is rollout.seed mixed with the step, the replica index and (when > 0) the draw, the
    generation batch within a step (dynamic sampling): different draws every step, batch and
    replica, the same on the tp_g ranks of one replica (they must generate identical tokens).
    """
    r = rollout_cfg
    src = r.val_kwargs if validate else r
    return SamplingParams(
        n=src.n,
        temperature=src.temperature,
        top_p=src.top_p,
        top_k=src.top_k,
        max_tokens=r.response_length,
        do_sample=src.do_sample,
        ignore_eos=r.ignore_eos,
        seed=_seed(r.seed, step, replica, draw),
        logprobs=True,
    )
