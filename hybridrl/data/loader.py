"""PromptLoader: batches of prompts as DataProto, resumable mid-epoch.

The order of epoch e is a permutation drawn from numpy's generator seeded with (seed, e), so it
depends on nothing else (not the global RNG, not how many batches were drawn before a restart).
The state is (epoch, position = batches already handed out in that epoch, seed); loading it makes
the next iteration continue with exactly the batch an uninterrupted run would have produced next.

    loader = PromptLoader(dataset, batch_size=256, shuffle=True, seed=1)
    for epoch in range(total_epochs):
        for batch in loader:          # the rest of the current epoch, then the epoch counter advances
            ...                        # checkpoint: loader.state_dict()

With drop_last=True (the trainer's setting) a trailing partial batch is never produced, so
len(loader) = len(dataset) // batch_size; drop_last=False adds one shorter final batch.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from hybridrl.protocol import DataProto

from .dataset import collate_to_dataproto

__all__ = ["PromptLoader"]


class PromptLoader:
    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
        collate_fn: Callable[[Sequence[dict]], DataProto] = collate_to_dataproto,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"PromptLoader: batch_size must be positive, got {batch_size}")
        n = len(dataset)
        if drop_last and n < batch_size:
            raise ValueError(f"PromptLoader: the dataset has {n} prompts, fewer than one batch of {batch_size} "
                             "(lower data.train_batch_size or add data)")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.epoch = 0
        self.position = 0  # batches of the current epoch already handed out

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Dataset indices in the order of `epoch`."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def batch_indices(self, epoch: int, position: int) -> np.ndarray:
        order = self.epoch_order(epoch)
        return order[position * self.batch_size:(position + 1) * self.batch_size]

    def _roll_over(self) -> None:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[DataProto]:
        """The remaining batches of the current epoch; afterwards the loader stands at the next epoch."""
        self._roll_over()
        epoch, order = self.epoch, self.epoch_order(self.epoch)
        while self.epoch == epoch and self.position < len(self):
            start = self.position * self.batch_size
            idx = order[start:start + self.batch_size]
            self.position += 1  # counted as handed out before the caller sees it
            batch = self.collate_fn([self.dataset[int(i)] for i in idx])
            batch.meta_info.update(epoch=epoch, batch_in_epoch=self.position - 1)
            yield batch
        self._roll_over()

    # ----------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        self._roll_over()
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "dataset_len": len(self.dataset), "batch_size": self.batch_size, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was taken; a different dataset size, batch size or shuffle is an error
        (the resumed run would silently see other batches)."""
        for key, mine in (("dataset_len", len(self.dataset)), ("batch_size", self.batch_size), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise ValueError(f"PromptLoader.load_state_dict: checkpoint has {key}={state[key]}, this run has {mine}; "
                                 "resuming would not reproduce the batch order")
        position = int(state["position"])
        if not 0 <= position <= len(self):
            raise ValueError(f"PromptLoader.load_state_dict: position {position} outside 0..{len(self)}")
        self.epoch, self.position, self.seed = int(state["epoch"]), position, int(state["seed"])

    def __repr__(self) -> str:
        return (f"PromptLoader(n={len(self.dataset)}, batch_size={self.batch_size}, batches/epoch={len(self)}, "
                f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, position={self.position})")


def make_prompt_loader(dataset: Any, config: Any, is_train: bool = True) -> PromptLoader:
    """The loader for data.* settings: train batches of data.train_batch_size (shuffled per data.shuffle,
    seed data.seed or 1, verl's default); validation in one batch unless data.val_batch_size is set."""
    seed: Optional[int] = config.seed
    if is_train:
        return PromptLoader(dataset, config.train_batch_size, shuffle=config.shuffle,
                            seed=1 if seed is None else seed, drop_last=True)
    size = config.val_batch_size or len(dataset)
    return PromptLoader(dataset, size, shuffle=config.validation_shuffle, seed=1 if seed is None else seed,
                        drop_last=False)
