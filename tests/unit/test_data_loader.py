"""PromptLoader: batches per epoch, per-epoch deterministic shuffling, exact resume across an epoch boundary."""
import random

import numpy as np
import pytest
import torch

from hybridrl.config.schema.data import DataConfig
from hybridrl.data import PromptLoader, RLHFDataset, build_tiny_tokenizer, make_prompt_loader
from tests.fixtures.data_helpers import rows_with_lengths, write_rows


class Indexed:
    """A dataset of n items {'input_ids': [i, i], 'id': i}."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i, i]), "id": i}


def ids_of(batch):
    assert batch.batch["input_ids"][:, 0].tolist() == list(batch.non_tensor_batch["id"])
    return list(batch.non_tensor_batch["id"])


def take(loader, n):
    """The next n batches, crossing epochs the way a trainer loop does."""
    out = []
    while len(out) < n:
        for batch in loader:
            out.append(ids_of(batch))
            if len(out) == n:
                return out
    return out


def test_len_and_epoch_order():
    loader = PromptLoader(Indexed(10), batch_size=3, shuffle=True, seed=5)
    assert len(loader) == 3
    epoch0 = [ids_of(b) for b in loader]
    assert len(epoch0) == 3 and all(len(b) == 3 for b in epoch0)
    expected0 = np.random.default_rng([5, 0]).permutation(10)[:9].tolist()
    assert sum(epoch0, []) == expected0
    assert loader.epoch == 1 and loader.position == 0
    epoch1 = sum([ids_of(b) for b in loader], [])
    assert epoch1 == np.random.default_rng([5, 1]).permutation(10)[:9].tolist()
    assert epoch1 != sum(epoch0, [])


def test_no_shuffle_and_drop_last_false():
    loader = PromptLoader(Indexed(7), batch_size=3, shuffle=False, seed=0, drop_last=False)
    assert len(loader) == 3
    assert [ids_of(b) for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]
    loader = PromptLoader(Indexed(7), batch_size=3, shuffle=False, seed=0)
    assert [ids_of(b) for b in loader] == [[0, 1, 2], [3, 4, 5]]


def test_order_ignores_global_rng():
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    a = take(PromptLoader(Indexed(10), 3, True, 11), 6)
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    np.random.rand(50), torch.rand(50)
    b = take(PromptLoader(Indexed(10), 3, True, 11), 6)
    assert a == b
    assert take(PromptLoader(Indexed(10), 3, True, 12), 6) != a


@pytest.mark.parametrize("stop_after", [1, 3, 4, 5, 7])  # 3 batches/epoch: 3 is exactly an epoch end
def test_resume_matches_uninterrupted(stop_after):
    total = 10
    reference = take(PromptLoader(Indexed(10), 3, True, 7), total)
    first = PromptLoader(Indexed(10), 3, True, 7)
    seen = take(first, stop_after)
    state = first.state_dict()
    assert state["epoch"] == stop_after // 3 and state["position"] == stop_after % 3 and state["seed"] == 7
    torch.manual_seed(99), np.random.seed(99)  # a restarted process has other global RNG state
    resumed = PromptLoader(Indexed(10), 3, True, seed=0)  # the seed comes from the checkpoint
    resumed.load_state_dict(state)
    seen += take(resumed, total - stop_after)
    assert seen == reference
    assert len({tuple(b) for b in reference[:3]}) == 3


def test_meta_info_and_state_checks():
    loader = PromptLoader(Indexed(10), 3, True, 1)
    b = next(iter(loader))
    assert b.meta_info == {"epoch": 0, "batch_in_epoch": 0}
    state = loader.state_dict()
    with pytest.raises(ValueError, match="checkpoint has dataset_len=10, this run has 11"):
        PromptLoader(Indexed(11), 3, True, 1).load_state_dict(state)
    with pytest.raises(ValueError, match="checkpoint has batch_size=3, this run has 2"):
        PromptLoader(Indexed(10), 2, True, 1).load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than one batch of 4"):
        PromptLoader(Indexed(3), 4, True, 1)


def test_make_prompt_loader_from_config(tmp_path):
    tok = build_tiny_tokenizer()
    path = write_rows(rows_with_lengths([1, 2, 3, 4, 5]), str(tmp_path / "a.parquet"))
    ds = RLHFDataset(path, tok, DataConfig(max_prompt_length=16))
    train = make_prompt_loader(ds, DataConfig(train_batch_size=2, seed=None))
    assert (len(train), train.seed, train.shuffle) == (2, 1, True)
    batch = next(iter(train))
    assert batch.batch["input_ids"].shape == (2, 16)
    assert list(batch.non_tensor_batch["index"]) == np.random.default_rng([1, 0]).permutation(5)[:2].tolist()
    val = make_prompt_loader(ds, DataConfig(val_batch_size=None), is_train=False)
    assert len(val) == 1 and [list(b.non_tensor_batch["index"]) for b in val] == [[0, 1, 2, 3, 4]]
