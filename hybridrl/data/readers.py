"""Reading prompt files into rows: parquet, Arrow IPC (.arrow/.feather, file or stream format), jsonl.

Every row keeps where it came from (file, 0-based row), so any later complaint about it (a missing
column, a wrong type, a prompt over max_prompt_length) names the exact place to fix. Nothing is
skipped silently: an unreadable, empty or malformed file is an error, never an empty contribution.

Rows are plain Python values (`pyarrow.Table.to_pylist`): a parquet list<struct> prompt becomes a list
of dicts, a struct column (reward_model, extra_info) a dict.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import pyarrow as pa

__all__ = ["DataFileError", "Rows", "SUPPORTED_EXTENSIONS", "read_file", "read_files", "expand_files"]

SUPPORTED_EXTENSIONS = (".parquet", ".arrow", ".feather", ".jsonl")


class DataFileError(ValueError):
    """Bad input data; the message names the file and, where they apply, the 0-based row and the column."""

    def __init__(self, file: str, problem: str, row: Optional[int] = None, column: Optional[str] = None) -> None:
        self.file, self.row, self.column, self.problem = file, row, column, problem
        where = file
        if row is not None:
            where += f": row {row}"
        if column is not None:
            where += f", column {column!r}" if row is not None else f": column {column!r}"
        super().__init__(f"{where}: {problem}")


@dataclass
class Rows:
    """Rows of one or more files, in file order; `sources[i]` is (file, row within that file)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    sources: list[tuple[str, int]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)


def expand_files(files: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]) -> list[str]:
    """A path or a list of paths, `~` expanded; an empty list is an error."""
    items = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not items:
        raise ValueError("no data files given (data.train_files / data.val_files is empty)")
    return [os.path.expanduser(os.fspath(f)) for f in items]


def read_files(
    files: Union[str, Sequence[str]], required_columns: Sequence[str] = (), max_rows: int = -1
) -> Rows:
    """All rows of `files` in order (the first `max_rows` when it is > 0).

    A column missing from any one file is an error when it is required; otherwise the rows of files
    without it hold None there (the union of the files' columns is kept).
    """
    out = Rows()
    seen: dict[str, None] = {}
    per_file: list[tuple[str, list[str], int]] = []
    for path in expand_files(files):
        records, columns = read_file(path)
        for col in required_columns:
            if col not in columns:
                raise DataFileError(path, f"missing column (the file has {columns})", column=col)
        per_file.append((path, columns, len(records)))
        seen.update(dict.fromkeys(columns))
        out.records.extend(records)
        out.sources.extend((path, i) for i in range(len(records)))
        if 0 < max_rows <= len(out.records):
            break
    out.columns = list(seen)
    for path, columns, _ in per_file:  # a column some files lack: None there, never a KeyError later
        if len(columns) != len(out.columns):
            missing = [c for c in out.columns if c not in columns]
            for rec, (src, _) in zip(out.records, out.sources):
                if src == path:
                    for c in missing:
                        rec.setdefault(c, None)
    if max_rows > 0:
        del out.records[max_rows:], out.sources[max_rows:]
    return out


def read_file(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, column names) of one file; errors name the file."""
    path = os.path.expanduser(path)
    if os.path.isdir(path):  # before the extension: a folder has none, and "unknown extension ''" said nothing
        raise DataFileError(path, f"is a directory; list the data files in it ({', '.join(SUPPORTED_EXTENSIONS)})")
    ext = _extension(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise DataFileError(path, "empty file (0 bytes)")
    if ext == ".jsonl":
        records, columns = _read_jsonl(path)
    else:
        table = _read_parquet(path) if ext == ".parquet" else _read_arrow(path)
        records, columns = table.to_pylist(), list(table.column_names)
    if not records:
        raise DataFileError(path, "empty file (no rows)")
    return records, columns


def _extension(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in SUPPORTED_EXTENSIONS:
        hint = " (JSON Lines files must end in .jsonl)" if ext == ".json" else ""
        raise DataFileError(path, f"unknown extension {ext!r}; supported: {', '.join(SUPPORTED_EXTENSIONS)}{hint}")
    return ext


def _read_parquet(path: str) -> pa.Table:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataFileError(path, f"cannot be read as parquet (corrupt or not parquet): {type(e).__name__}: {e}") from e


def _read_arrow(path: str) -> pa.Table:
    """Feather v1/v2 and the Arrow IPC file format, then the IPC stream format."""
    import pyarrow.feather as feather

    try:
        return feather.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as file_err:
        try:
            with pa.memory_map(path) as source:
                return pa.ipc.open_stream(source).read_all()
        except (pa.ArrowException, OSError, ValueError) as stream_err:
            raise DataFileError(
                path,
                "cannot be read as Arrow IPC (neither file/feather nor stream format; corrupt or not Arrow): "
                f"{type(file_err).__name__}: {file_err}; stream: {type(stream_err).__name__}: {stream_err}",
            ) from stream_err


def _read_jsonl(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    records: list[dict[str, Any]] = []
    columns: dict[str, None] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataFileError(path, f"cannot be read as UTF-8 text: {type(e).__name__}: {e}") from e
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue  # blank lines hold no row
        row = len(records)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFileError(path, f"(line {lineno}) is not valid JSON: {e}", row=row) from e
        if not isinstance(obj, dict):
            raise DataFileError(path, f"(line {lineno}) is a JSON {type(obj).__name__}, expected an object", row=row)
        records.append(obj)
        columns.update(dict.fromkeys(obj))
    cols = list(columns)
    for rec in records:  # jsonl rows may omit keys; align them like a table would
        for c in cols:
            rec.setdefault(c, None)
    return records, cols
