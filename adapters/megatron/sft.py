"""MegatronSFT: supervised fine-tuning on the actor's engine (same builder, weights, packing, optimizer,
schedules and checkpoints as MegatronActor), with the masked NLL of hybridrl.algos.sft as its objective.

Batches are in RL's layout (hybridrl.data.sft_dataset.collate_sft: first token as prompt, the rest as response,
response_mask = the loss mask), so micro-batching, THD packing and the vocab-parallel log-probs are the actor's.
One `train_batch` is one optimizer step over the whole batch; the loss of each micro-batch is its share of the
step's token-mean (exact accumulation, as actor.py explains), so micro-batch size and dp do not change the update.
"""
from __future__ import annotations

from typing import Optional

import torch

from hybridrl.algos.sft import sft_loss
from hybridrl.config.layout import BatchPlan, ParallelLayout
from hybridrl.config.schema.common import MegatronConfig, OptimConfig
from hybridrl.protocol import DataProto

from .actor import global_batch
from .forward import MicroBatch, response_log_probs
from .role import MegatronRole

LOSS = "train/loss"


class MegatronSFT(MegatronRole):
    role = "train"  # metric prefix: train/loss, train/grad_norm, train/lr (verl's SFT names)

    def __init__(self, hf_path: str, megatron: MegatronConfig, optim: OptimConfig, layout: ParallelLayout,
                 batch: BatchPlan, *, total_training_steps: Optional[int] = None, recompute: bool = False,
                 remove_padding: bool = True, override_config: Optional[dict] = None) -> None:
        self.cfg = None  # no shuffling inside a step: the loader shuffles (role._shuffle_seed)
        self.batch = batch
        self.overrides = dict(override_config or {})
        super().__init__(hf_path, megatron, layout, optim=optim, override_config=override_config, recompute=recompute,
                         total_training_steps=total_training_steps, remove_padding=remove_padding)

    def train_batch(self, data: DataProto) -> dict[str, float]:
        """One optimizer step on this rank's rows; train/loss is the step's mean NLL over every trained token."""
        vocab = self.arch.vocab_size

        def make_loss_fn(mini: DataProto):
            batch = global_batch(mini)

            def loss_fn(out: torch.Tensor, mb: MicroBatch):
                stats = response_log_probs(out, mb, vocab, 1.0, with_entropy=False)
                result = sft_loss(stats.log_probs, mb.extras["response_mask"], batch)
                # the engine sums over micro-batches and dp: each rank's share of the global mean
                return result.loss / batch.dp_size, {LOSS: result.loss.detach() / batch.dp_size}

            return loss_fn

        metrics = self._update(data, ["response_mask"], make_loss_fn, [LOSS])
        metrics["train/tokens"] = float(global_batch(data).batch_num_tokens or 0.0)
        return metrics

    def nll_per_row(self, data: DataProto) -> DataProto:
        """Forward only: each row's summed NLL of its trained tokens and their count ([B] each)."""
        plan, vocab = self.batch, self.arch.vocab_size
        mbs = self._micro_batches(data, ["response_mask"], plan.forward_micro_batch_per_gpu,
                                  plan.forward_max_token_len_per_gpu if plan.use_dynamic_bsz else None)

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            stats = response_log_probs(out, mb, vocab, 1.0, with_entropy=False)
            mask = mb.extras["response_mask"].to(stats.log_probs.dtype)
            return stats.log_probs.new_zeros(()), {"nll": -(stats.log_probs * mask).sum(-1)}

        results = self.engine.run(mbs, loss_fn, forward_only=True)
        nll = self._gather_rows(results, mbs, "nll", (len(data),))
        return DataProto.from_dict({"nll": nll, "tokens": data.batch["response_mask"].sum(-1).float()})

    def save_hf(self, out: str, tokenizer_dir: Optional[str] = None, bucket_bytes: int = 1 << 28) -> None:
        """Collective: the model as an HF folder (safetensors + config + tokenizer) written by rank 0, what
        `python -m hybridrl.model_merger merge` would write from this step's checkpoint, without the second pass."""
        import torch.distributed as dist

        from .hf_io import SafetensorsWriter, copy_side_files

        writer = SafetensorsWriter(out) if dist.get_rank() == 0 else None
        for bucket in self.export_weights(bucket_bytes):  # every rank takes part in the gathers
            if writer is not None:
                writer.write(bucket)
        if writer is not None:
            writer.close()
            copy_side_files(self.hf_path, out)
            if tokenizer_dir and tokenizer_dir != self.hf_path:
                copy_side_files(tokenizer_dir, out)
            if self.overrides:  # the model as trained: model.override_config applied to its config
                self.hf_config.to_json_file(f"{out}/config.json")
        dist.barrier()
