"""Building the train/val dataset from `data.*`: RLHFDataset or the user's class (data.custom_cls).

A custom class is loaded with `load_object` and constructed as verl does:
`cls(data_files=..., tokenizer=..., config=..., processor=...)`; it is checked up front to accept
those keywords and to be a map-style dataset (__len__, __getitem__ returning dicts). A class that
also accepts `max_samples` (as RLHFDataset does) gets data.{train,val}_max_samples; a dataset still
longer than that is cut to its first N items through a view, so the setting is honoured either way.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence, Union

from hybridrl.utils.imports import load_object

from .dataset import RLHFDataset

__all__ = ["create_rl_dataset", "load_dataset_class", "FirstN"]

_REQUIRED = ("data_files", "tokenizer", "config", "processor")


def load_dataset_class(config: Any) -> type:
    """RLHFDataset, or the class at data.custom_cls.path/name after a signature check."""
    custom = config.custom_cls
    if not custom.path:
        return RLHFDataset
    name = custom.name
    if not name:
        raise ValueError(f"data.custom_cls.path={custom.path} is set but data.custom_cls.name is empty")
    cls = load_object(custom.path, name, key="data.custom_cls.path", name_key="data.custom_cls.name")
    where = f"data.custom_cls {custom.path}:{name}"
    if not inspect.isclass(cls):
        raise TypeError(f"{where} is a {type(cls).__name__}, expected a dataset class")
    if not issubclass(cls, RLHFDataset):
        missing = [m for m in ("__len__", "__getitem__") if not callable(getattr(cls, m, None))]
        if missing:
            raise TypeError(f"{where} has no {missing}; a dataset class needs __len__ and __getitem__ "
                            "(or subclass hybridrl.data.RLHFDataset)")
    try:
        inspect.signature(cls).bind(**{k: None for k in _REQUIRED})
    except TypeError as e:
        raise TypeError(f"{where}: its constructor must accept (data_files, tokenizer, config, processor=None) "
                        f"like verl's RLHFDataset; binding those keywords failed: {e}") from e
    return cls


def create_rl_dataset(
    data_files: Union[str, Sequence[str]],
    config: Any,
    tokenizer: Any,
    processor: Any = None,
    is_train: bool = True,
) -> Any:
    """The dataset for data.train_files (is_train) or data.val_files, with *_max_samples applied."""
    cls = load_dataset_class(config)
    max_samples = config.train_max_samples if is_train else config.val_max_samples
    kwargs: dict[str, Any] = dict(data_files=data_files, tokenizer=tokenizer, config=config, processor=processor)
    if _accepts(cls, "max_samples"):
        kwargs["max_samples"] = max_samples
    dataset = cls(**kwargs)
    if max_samples is not None and 0 < max_samples < len(dataset):  # the class ignored or lacks max_samples
        dataset = FirstN(dataset, max_samples)
    if len(dataset) == 0:
        which = "data.train_files" if is_train else "data.val_files"
        raise ValueError(f"{which}: the dataset ({cls.__name__}) has no items")
    return dataset


def _accepts(cls: type, name: str) -> bool:
    """An explicit parameter `name`, or **kwargs on an RLHFDataset subclass (which forwards them)."""
    params = inspect.signature(cls).parameters.values()
    forwards = issubclass(cls, RLHFDataset) and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return forwards or any(p.name == name for p in params)


class FirstN:
    """The first n items of a dataset (for custom classes without a max_samples argument)."""

    def __init__(self, dataset: Any, n: int) -> None:
        self.dataset, self.n = dataset, min(n, len(dataset))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not -self.n <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} items")
        return self.dataset[i % self.n]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
