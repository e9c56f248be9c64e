"""MegatronRewardModel: a discriminative reward model on the critic's network, forward only.

The checkpoint is a HuggingFace *ForSequenceClassification (head `score.weight`) or *ForTokenClassification
(`score.weight` + `score.bias`) with num_labels=1; both load through the one mapping (mapping.plan's value-head
rows) into the decoder + scalar head the critic uses (builder.ValueHead). A sequence's score is the head's output
at its LAST valid token, which is what transformers' *ForSequenceClassification pools and where verl reads its
token-classification reward model.

How the last token is read with the actor's micro-batching (padded, packed THD, context parallel): each row's
valid tokens are right-aligned and one padding column is appended as a one-token "response"
(score_layout); the output that "predicts" that response token is the output at the last real token, and a
causal model's output there never depends on the appended token. So forward.gather_response, pack_thd and
split_for_cp do the work, unchanged.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from hybridrl.config.layout import ParallelLayout
from hybridrl.config.schema.critic import RewardModelConfig
from hybridrl.protocol import DataProto

from .forward import MicroBatch, gather_response, sum_over_cp
from .hf_config import UnsupportedModelError, load_hf_config, score_head_has_bias
from .hf_io import SafetensorsReader
from .role import MegatronRole

SCORE_ARCHITECTURES = ("ForSequenceClassification", "ForTokenClassification")


def score_head_bias(hf_config: Any, path: str, key: str = "reward_model.model.path") -> bool:
    """Whether the checkpoint's score head has a bias (*ForTokenClassification); rejects what is no reward model."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    kinds = [a for a in archs if a.endswith(SCORE_ARCHITECTURES)]
    if not kinds:
        raise UnsupportedModelError(f"{key}={path}: config.json architectures={archs} names no *ForSequenceClassification"
                                    " or *ForTokenClassification model; a reward model needs a trained score head")
    labels = int(getattr(hf_config, "num_labels", 1))
    if labels != 1:
        raise UnsupportedModelError(f"{key}={path}: num_labels={labels} in config.json; a reward model scores with one "
                                    "label (num_labels=1)")
    return score_head_has_bias(hf_config)


def score_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_id: int = 0) -> DataProto:
    """[B, T] sequences (any padding, one contiguous run of valid tokens per row) -> [B, T+1] rows whose valid
    tokens end at column T-1, then a padding column counted as the one-token response (see the module doc)."""
    b, t = input_ids.shape
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    ends = torch.where(lengths > 0, t - 1 - mask.flip(1).float().argmax(1), torch.zeros_like(lengths))
    shift = (t - 1) - ends  # move each row right by this much
    cols = torch.arange(t)
    src = (cols[None] - shift[:, None])
    inside = (src >= 0) & (src < t)
    ids = torch.full((b, t + 1), pad_id, dtype=input_ids.dtype)
    new_mask = torch.zeros((b, t + 1), dtype=attention_mask.dtype)
    ids[:, :t] = torch.where(inside, input_ids.gather(1, src.clamp(0, t - 1)), torch.full_like(ids[:, :t], pad_id))
    new_mask[:, :t] = torch.where(inside, attention_mask.gather(1, src.clamp(0, t - 1)), torch.zeros_like(new_mask[:, :t]))
    new_mask[:, t] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": new_mask, "responses": ids[:, t:].clone()})


class MegatronRewardModel(MegatronRole):
    """One reward model on this rank's slot of the layout (the actor's); every method is collective."""

    role = "reward_model"

    def __init__(self, cfg: RewardModelConfig, layout: ParallelLayout, *, micro_batch_per_gpu: Optional[int],
                 max_token_len_per_gpu: Optional[int], remove_padding: bool = False) -> None:
        path = cfg.model.path
        bias = score_head_bias(load_hf_config(path), path)
        if cfg.load_weight and not SafetensorsReader(path).has("score.weight"):
            raise UnsupportedModelError(f"reward_model.model.path={path}: the checkpoint has no score.weight; a reward "
                                        "model's score head must be trained (set reward_model.load_weight=false only "
                                        "for a random model)")
        self.cfg = cfg
        self.micro_batch_per_gpu = micro_batch_per_gpu
        self.max_token_len_per_gpu = max_token_len_per_gpu  # not None: dynamic micro-batches of this many tokens
        super().__init__(path, cfg.megatron, layout, optim=None, value_head=True,
                         override_config=cfg.model.override_config, load_weight=cfg.load_weight,
                         remove_padding=remove_padding, head_bias=bias)

    @torch.no_grad()
    def compute_scores(self, data: DataProto) -> DataProto:
        """input_ids/attention_mask [B, T] (the reward model's tokens) -> rm_score [B] float32 (0 for an empty row)."""
        pad = int(getattr(self.hf_config, "pad_token_id", None) or 0)
        laid = score_layout(data.batch["input_ids"], data.batch["attention_mask"], pad)
        mbs = self._micro_batches(laid, [], self.micro_batch_per_gpu or len(laid), self.max_token_len_per_gpu)

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            score = gather_response(out, mb).squeeze(-1).float()  # [b, 1]
            score = sum_over_cp(torch.where(mb.resp_valid, score, torch.zeros_like(score)), mb)
            return score.new_zeros(()), {"score": score}

        results = self.engine.run(mbs, loss_fn, forward_only=True)
        scores = self._gather_rows(results, mbs, "score", (len(laid), 1))[:, 0]
        return DataProto.from_dict({"rm_score": scores})
