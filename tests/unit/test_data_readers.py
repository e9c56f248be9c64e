"""Readers and bad input: every failure names the file, and the row and column where they apply."""
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.config.schema.data import DataConfig
from hybridrl.data import DataFileError, RLHFDataset, build_tiny_tokenizer, read_file, read_files
from tests.fixtures.data_helpers import rows_with_lengths, verl_row, write_rows


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.mark.parametrize("fmt,ext", [("parquet", "parquet"), ("arrow", "arrow"), ("stream", "arrow"),
                                     ("feather", "feather"), ("stream", "feather"), ("jsonl", "jsonl")])
def test_each_format_reads_back_the_rows(tmp_path, fmt, ext):
    rows = rows_with_lengths([3, 1, 2])
    path = write_rows(rows, str(tmp_path / f"d.{ext}"), fmt)
    records, columns = read_file(path)
    assert columns == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert records == rows


def test_several_files_keep_order_sources_and_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    a = write_rows(rows_with_lengths([1, 2], 0), str(tmp_path / "a.parquet"))
    b = write_rows(rows_with_lengths([3], 10), str(tmp_path / "b.jsonl"))
    c = write_rows(rows_with_lengths([4, 5], 20), str(tmp_path / "c.arrow"))
    rows = read_files(["~/a.parquet", "~/b.jsonl", "~/c.arrow"])
    assert [r["extra_info"]["index"] for r in rows.records] == [0, 1, 10, 20, 21]
    assert rows.sources == [(a, 0), (a, 1), (b, 0), (c, 0), (c, 1)]
    assert read_files([a, b, c], max_rows=3).sources == [(a, 0), (a, 1), (b, 0)]


def test_column_missing_in_one_file_is_none_there(tmp_path):
    a = write_rows([dict(verl_row("x"), extra_col=7)], str(tmp_path / "a.jsonl"))
    b = write_rows([verl_row("y")], str(tmp_path / "b.jsonl"))
    rows = read_files([a, b])
    assert [r["extra_col"] for r in rows.records] == [7, None]


def test_missing_column_names_file_and_column(tmp_path):
    rows = [{k: v for k, v in verl_row("x").items() if k != "prompt"}]
    path = write_rows(rows, str(tmp_path / "noprompt.parquet"))
    with pytest.raises(DataFileError) as e:
        read_files([path], required_columns=["prompt"])
    assert str(e.value).startswith(f"{path}: column 'prompt': missing column (the file has ['data_source'")
    assert (e.value.file, e.value.row, e.value.column) == (path, None, "prompt")


def test_jsonl_row_without_prompt_names_row_and_column(tmp_path, tok):
    rows = [verl_row("a"), verl_row("b"), {"data_source": "openai/gsm8k", "question": "q"}]
    path = write_rows(rows, str(tmp_path / "r.jsonl"))
    with pytest.raises(DataFileError) as e:
        RLHFDataset(path, tok, DataConfig())
    assert str(e.value).startswith(f"{path}: row 2, column 'prompt': wrong type: missing (null)")


@pytest.mark.parametrize("ext", ["parquet", "arrow", "jsonl"])
def test_zero_byte_file(tmp_path, ext):
    path = str(tmp_path / f"empty.{ext}")
    open(path, "wb").close()
    with pytest.raises(DataFileError, match=r"empty\.%s: empty file \(0 bytes\)$" % ext):
        read_file(path)


def test_file_without_rows(tmp_path):
    table = pa.Table.from_pylist(rows_with_lengths([1])).slice(0, 0)
    path = str(tmp_path / "norows.parquet")
    pq.write_table(table, path)
    with pytest.raises(DataFileError, match=r"norows\.parquet: empty file \(no rows\)$"):
        read_file(path)
    blank = str(tmp_path / "blank.jsonl")
    with open(blank, "w") as f:
        f.write("\n  \n")
    with pytest.raises(DataFileError, match=r"blank\.jsonl: empty file \(no rows\)$"):
        read_file(blank)


@pytest.mark.parametrize("ext", ["parquet", "arrow", "feather"])
def test_corrupt_file_names_the_file(tmp_path, ext):
    good = write_rows(rows_with_lengths([5, 6, 7]), str(tmp_path / f"good.{ext}"), "arrow" if ext == "feather" else ext)
    data = open(good, "rb").read()
    bad = str(tmp_path / f"bad.{ext}")
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])  # truncated
    with pytest.raises(DataFileError) as e:
        read_file(bad)
    assert str(e.value).startswith(f"{bad}: cannot be read as ")
    assert "corrupt" in str(e.value)
    garbage = str(tmp_path / f"garbage.{ext}")
    with open(garbage, "wb") as f:
        f.write(b"not a table at all" * 10)
    with pytest.raises(DataFileError, match="cannot be read as"):
        read_file(garbage)


def test_bad_jsonl_line_names_line_and_row(tmp_path):
    path = str(tmp_path / "bad.jsonl")
    with open(path, "w") as f:
        f.write('{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": \n')
    with pytest.raises(DataFileError) as e:
        read_file(path)
    assert str(e.value).startswith(f"{path}: row 2: (line 4) is not valid JSON")
    with open(path, "w") as f:
        f.write('{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(DataFileError, match=r"row 1: \(line 2\) is a JSON list, expected an object"):
        read_file(path)


def test_unknown_extension_and_missing_file(tmp_path):
    path = str(tmp_path / "d.csv")
    with open(path, "w") as f:
        f.write("prompt\nx\n")
    with pytest.raises(DataFileError, match=r"d\.csv: unknown extension '\.csv'; supported: \.parquet, \.arrow, "
                                            r"\.feather, \.jsonl$"):
        read_file(path)
    with pytest.raises(DataFileError, match=r"JSON Lines files must end in \.jsonl"):
        read_file(str(tmp_path / "d.json"))
    with pytest.raises(FileNotFoundError, match="nope.parquet: no such file"):
        read_file(str(tmp_path / "nope.parquet"))
    with pytest.raises(ValueError, match="no data files given"):
        read_files([])


@pytest.mark.parametrize("prompt,problem", [
    (5, "expected a list of {'role', 'content'} messages or a string, got int 5"),
    ([], "empty message list"),
    (["hello"], "message 0 is a str 'hello', expected a dict with 'role' and 'content'"),
    ([{"role": "user"}], "message 0: 'content' is missing, expected a string"),
    ([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}], "message 1: 'role' is a int, expected a string"),
])
def test_wrong_prompt_type_names_file_row_column(tmp_path, tok, prompt, problem):
    rows = [verl_row("fine"), dict(verl_row("fine"), prompt=prompt)]
    path = write_rows(rows, str(tmp_path / "t.jsonl"))
    with pytest.raises(DataFileError) as e:
        RLHFDataset([path], tok, DataConfig())
    assert str(e.value).startswith(f"{path}: row 1, column 'prompt': wrong type: {problem}")
    assert (e.value.row, e.value.column) == (1, "prompt")


def test_wrong_reward_model_and_extra_info_types(tmp_path, tok):
    path = write_rows([verl_row("a"), dict(verl_row("b"), reward_model="42")], str(tmp_path / "rm.jsonl"))
    with pytest.raises(DataFileError, match=r"rm\.jsonl: row 1, column 'reward_model': wrong type: expected a dict "
                                            r"with 'ground_truth'"):
        RLHFDataset(path, tok, DataConfig())
    path = write_rows([dict(verl_row("a"), extra_info=[1])], str(tmp_path / "ei.jsonl"))
    with pytest.raises(DataFileError, match=r"ei\.jsonl: row 0, column 'extra_info': wrong type: expected a dict"):
        RLHFDataset(path, tok, DataConfig())


def test_wrong_type_inside_parquet_struct(tmp_path, tok):
    rows = [verl_row("a"), verl_row("b"), verl_row("c")]
    rows[2]["prompt"] = [{"role": "user", "content": None}]
    path = write_rows(rows, str(tmp_path / "s.parquet"))
    with pytest.raises(DataFileError, match=r"s\.parquet: row 2, column 'prompt': wrong type: message 0: 'content' "
                                            r"is missing"):
        RLHFDataset(path, tok, DataConfig())


def test_directory_is_refused(tmp_path):
    d = tmp_path / "dir.parquet"
    os.makedirs(d)
    with pytest.raises(DataFileError, match="is a directory"):
        read_file(str(d))
