"""examples/data_preprocess/gsm8k.py on local files, the gsm_symbolic generator, the arithmetic task."""
import importlib.util
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.config.schema.data import DataConfig
from hybridrl.data import DataFileError, RLHFDataset, arithmetic, build_tiny_tokenizer, gen_gsm_symbolic
from hybridrl.reward import arithmetic as arithmetic_score
from hybridrl.reward import default_compute_score, gsm8k
from tests.fixtures.data_helpers import write_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

VERL_SCHEMA_FIELDS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def load_script():
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess", os.path.join(ROOT, "examples", "data_preprocess",
                                                                                  "gsm8k.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


QA = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A car costs 1,200 dollars twice. Total?", "answer": "2*1200=2400\n#### 2,400"},
    {"question": "It is 5 degrees and drops 8. Now?", "answer": "5-8=-3\n#### -3"},
]


def test_gsm8k_script_on_local_files(tmp_path):
    train = write_rows(QA[:2], str(tmp_path / "raw" / "train.jsonl"))
    test = write_rows(QA[2:], str(tmp_path / "raw" / "test.parquet"))
    out = tmp_path / "out"
    written = load_script().main(["--train_file", train, "--test_file", test, "--output_dir", str(out)])
    assert written == {"train": str(out / "train.parquet"), "test": str(out / "test.parquet")}
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert rows[1] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": QA[1]["question"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2400"},
        "extra_info": {"split": "train", "index": 1, "answer": QA[1]["answer"], "question": QA[1]["question"]},
    }
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "2400"]
    test_rows = pq.read_table(out / "test.parquet").to_pylist()
    assert test_rows[0]["reward_model"]["ground_truth"] == "-3" and test_rows[0]["extra_info"]["split"] == "test"
    ds = RLHFDataset(str(out / "train.parquet"), build_tiny_tokenizer(), DataConfig(max_prompt_length=200))
    assert len(ds) == 2 and ds[0]["reward_model"]["ground_truth"] == "7"


def test_gsm8k_script_folder_layout_and_verl_flag_names(tmp_path):
    write_rows(QA, str(tmp_path / "gsm8k" / "main" / "train-00000-of-00001.parquet"))
    write_rows(QA[:1], str(tmp_path / "gsm8k" / "main" / "test-00000-of-00001.parquet"))
    written = load_script().main(["--local_dataset_path", str(tmp_path / "gsm8k"), "--local_dir", str(tmp_path / "o")])
    assert sorted(written) == ["test", "train"]
    assert pq.read_table(written["train"]).num_rows == 3 and pq.read_table(written["test"]).num_rows == 1


def test_gsm8k_script_bad_input(tmp_path):
    bad = write_rows([{"question": "q"}], str(tmp_path / "train.jsonl"))
    with pytest.raises(DataFileError, match=r"train.jsonl: column 'answer': missing column"):
        load_script().main(["--input", bad, "--output_dir", str(tmp_path / "o")])
    no_final = write_rows([{"question": "q", "answer": "no final line"}], str(tmp_path / "t2.jsonl"))
    with pytest.raises(ValueError, match=r"t2.jsonl: row 0: answer has no '#### N' final answer"):
        load_script().main(["--input", no_final, "--output_dir", str(tmp_path / "o")])


def test_gsm_symbolic_generator(tmp_path):
    pytest.importorskip("reasoning_gym")
    written = gen_gsm_symbolic.main(["--out_dir", str(tmp_path), "--train", "5", "--test", "3", "--seed", "11"])
    train = pq.read_table(written["train"])
    assert train.column_names == VERL_SCHEMA_FIELDS and train.num_rows == 5
    assert train.schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert train.schema.field("reward_model").type == pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
    assert [f.name for f in train.schema.field("extra_info").type] == ["split", "index", "answer", "question", "source"]
    test = pq.read_table(written["test"]).to_pylist()
    assert len(test) == 3 and [r["extra_info"]["index"] for r in test] == [0, 1, 2]
    rows = train.to_pylist()
    for i, r in enumerate(rows):
        content = r["prompt"][0]["content"]
        assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math" and r["prompt"][0]["role"] == "user"
        assert content == r["extra_info"]["question"] + " " + INSTRUCTION
        assert "Do not include units" not in content
        assert r["extra_info"]["split"] == "train" and r["extra_info"]["index"] == i
        truth = r["reward_model"]["ground_truth"]
        assert r["extra_info"]["answer"].endswith("\n#### " + truth)
        assert gsm8k.compute_score(r["extra_info"]["answer"], truth) == 1.0
        assert default_compute_score("openai/gsm8k", r["extra_info"]["answer"], truth) == 1.0
        assert gsm8k.compute_score(r["extra_info"]["answer"] + "1", truth) == 0.0
    again = gen_gsm_symbolic.generate_rows(5, 3, seed=11)
    assert again["train"] == rows
    assert gen_gsm_symbolic.generate_rows(5, 0, seed=12)["train"] != rows


def test_gsm_symbolic_normalizes_decimal_final_line():
    entry = {"question": "How many? Give the result as your final answer. Do not include units.", "answer": "36",
             "metadata": {"answer_cot": "12 * 3 = 36 ounces\n#### 36.0"}}
    assert gen_gsm_symbolic._entry_to_qa(entry, 0) == ("How many?", "12 * 3 = 36 ounces\n#### 36")
    entry["metadata"]["answer_cot"] = "x\n#### 35"
    with pytest.raises(ValueError, match="entry 0: solution's final answer '35' disagrees with answer '36'"):
        gen_gsm_symbolic._entry_to_qa(entry, 0)


def test_arithmetic_task(tmp_path):
    written = arithmetic.main(["--out_dir", str(tmp_path), "--train", "50", "--test", "10", "--seed", "3"])
    rows = pq.read_table(written["train"]).to_pylist()
    assert len(rows) == 50 and pq.read_table(written["test"]).num_rows == 10
    for i, r in enumerate(rows):
        expr = r["extra_info"]["expression"]
        a, b = expr.split("+")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert r["prompt"] == [{"role": "user", "content": expr + "="}]
        assert r["reward_model"] == {"style": "rule", "ground_truth": str(int(a) + int(b))}
        assert r["data_source"] == "arithmetic" and r["extra_info"]["index"] == i
        assert default_compute_score("arithmetic", r["reward_model"]["ground_truth"], r["reward_model"]["ground_truth"]) == 1.0
    assert len({r["extra_info"]["expression"] for r in rows}) > 20
    assert arithmetic.generate_rows(50, 10, seed=3)["train"] == rows


def test_arithmetic_subtraction_is_never_negative():
    import random

    rng = random.Random(0)
    for _ in range(300):
        expr, value = arithmetic.make_problem(rng, max_operand=9, ops="-", n_terms=2)
        a, b = map(int, expr.split("-"))
        assert a >= b and value == a - b >= 0
    for _ in range(300):
        expr, value = arithmetic.make_problem(rng, max_operand=20, ops="+-", n_terms=3)
        assert value == eval(expr) >= 0
    assert arithmetic_score.compute_score(" 12\n", "12") == 1.0
