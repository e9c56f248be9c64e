"""Prompt data: readers (parquet, Arrow, jsonl), RLHFDataset, the resumable PromptLoader, tokenizers,
and the offline data generators (gsm_symbolic, arithmetic)."""
from .dataset import TENSOR_KEYS, PromptTooLongError, RLHFDataset, collate_to_dataproto
from .factory import create_rl_dataset, load_dataset_class
from .loader import PromptLoader, make_prompt_loader
from .readers import DataFileError, read_file, read_files
from .tokenizer import build_tiny_tokenizer, load_tokenizer

__all__ = [
    "DataFileError", "PromptLoader", "PromptTooLongError", "RLHFDataset", "TENSOR_KEYS", "build_tiny_tokenizer",
    "collate_to_dataproto", "create_rl_dataset", "load_dataset_class", "load_tokenizer", "make_prompt_loader",
    "read_file", "read_files",
]
