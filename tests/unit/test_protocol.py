import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto, pad_to_multiple, unpad


def make(n=5):
    return DataProto.from_dict(
        {"x": torch.arange(n * 2).view(n, 2), "y": torch.arange(n).float()},
        {"s": [f"r{i}" for i in range(n)], "d": [{"gt": i} for i in range(n)]},
        {"temperature": 0.7},
    )


def rows(d: DataProto) -> list:
    return [(d.batch["x"][i].tolist(), d.batch["y"][i].item(), d.non_tensor_batch["s"][i]) for i in range(len(d))]


def test_lengths_must_agree():
    with pytest.raises(ValueError, match="disagree"):
        DataProto.from_dict({"x": torch.zeros(3, 2)}, {"s": ["a", "b"]})


def test_chunk_concat_roundtrip_and_indivisible_error():
    d = make(6)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert rows(DataProto.concat(parts)) == rows(d)
    with pytest.raises(ValueError, match="pad_to_multiple"):
        make(5).chunk(2)


def test_split_last_shorter():
    assert [len(p) for p in make(5).split(2)] == [2, 2, 1]


def test_repeat_interleave_and_tile():
    d = make(2)
    inter = d.repeat(3, interleave=True)
    assert inter.non_tensor_batch["s"].tolist() == ["r0", "r0", "r0", "r1", "r1", "r1"]
    assert inter.batch["x"].tolist() == [[0, 1]] * 3 + [[2, 3]] * 3
    tiled = d.repeat(2, interleave=False)
    assert tiled.non_tensor_batch["s"].tolist() == ["r0", "r1", "r0", "r1"]
    assert tiled.batch["y"].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_pad_and_unpad():
    d = make(5)
    padded, pad = pad_to_multiple(d, 4)
    assert pad == 3 and len(padded) == 8
    # padding repeats real rows from the start, so downstream math stays finite
    assert padded.non_tensor_batch["s"].tolist()[5:] == ["r0", "r1", "r2"]
    assert rows(unpad(padded, pad)) == rows(d)
    same, zero = pad_to_multiple(d, 5)
    assert zero == 0 and same is d


def test_select_pop_union():
    d = make(3)
    s = d.select(["x"], ["s"])
    assert set(s.batch) == {"x"} and set(s.non_tensor_batch) == {"s"}
    with pytest.raises(KeyError, match="present"):
        d.select(["nope"])
    popped = d.pop(["y"])
    assert "y" not in d.batch and torch.equal(popped.batch["y"], torch.arange(3).float())
    u = d.union(popped)
    assert set(u.batch) == {"x", "y"}
    bad = DataProto.from_dict({"x": torch.zeros(3, 2, dtype=torch.long)})
    with pytest.raises(ValueError, match="differs"):
        d.union(bad)


def test_index_by_list_tensor_and_reorder():
    d = make(4)
    assert d[[3, 0]].non_tensor_batch["s"].tolist() == ["r3", "r0"]
    assert d[torch.tensor([1, 2])].batch["y"].tolist() == [1.0, 2.0]
    assert d.reorder([2, 1, 0, 3]).non_tensor_batch["d"][0] == {"gt": 2}
    assert len(d[1]) == 1 and d[-1].non_tensor_batch["s"].tolist() == ["r3"]


def test_non_tensor_of_lists_stays_object_array():
    d = DataProto.from_dict({"x": torch.zeros(2, 1)}, {"msgs": [[{"role": "user"}], [{"role": "user"}, {"role": "a"}]]})
    assert d.non_tensor_batch["msgs"].dtype == object and len(d.non_tensor_batch["msgs"][1]) == 2
    assert isinstance(np.concatenate([d.non_tensor_batch["msgs"]] * 2), np.ndarray)
