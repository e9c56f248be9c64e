"""main_eval: pass@k against hand-computed values, per data_source and overall, and its failure modes."""
import json
import math
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.config.loader import ConfigError, load_config
from hybridrl.config.schema import EvalConfig
from hybridrl.trainer.main_eval import ks_for, main, pass_at_k

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if solution_str == "boom":
        raise ZeroDivisionError("scorer bug")
    return (1.0 if solution_str.strip() == ground_truth else 0.0) + bonus
'''


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


ROWS = [  # 1 of 4 correct; 0 of 4; 2 of 4
    {"data_source": "toy", "prompt": "2+2?", "responses": ["4", "5", "6", "7"], "reward_model": {"ground_truth": "4"}},
    {"data_source": "toy", "prompt": "a->b?", "responses": ["a", "a", "a", "a"], "reward_model": {"ground_truth": "b"}},
    {"data_source": "other", "prompt": "x?", "responses": ["x", "x", "y", "y"], "reward_model": {"ground_truth": "x"}},
]


@pytest.fixture
def files(tmp_path):
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    data = tmp_path / "gen.parquet"
    write_parquet(data, ROWS)
    return data, reward


def test_pass_at_k_by_hand():
    assert (pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 1, 4)) == pytest.approx((0.25, 0.5, 1.0))
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(3, 3, 1) == 1.0
    for n in range(1, 12):  # the product form equals the binomial definition
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4] and ks_for(1) == [1]
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_main_eval_per_source_and_overall(files, capsys):
    data, reward = files
    rc = main([f"data.path={data}", "data.response_key=responses", "data.data_source_key=data_source",
               "data.reward_model_key=reward_model", f"custom_reward_function.path={reward}",
               "custom_reward_function.name=compute_score"])
    assert rc == 0
    results = json.loads((data.parent / "gen.eval.json").read_text())
    toy, other, overall = results["per_data_source"]["toy"], results["per_data_source"]["other"], results["overall"]
    assert toy == pytest.approx({"num_prompts": 2, "num_responses": 8, "mean_score": 0.125,
                                 "pass@1": 0.125, "pass@2": 0.25, "pass@4": 0.5})
    assert other == pytest.approx({"num_prompts": 1, "num_responses": 4, "mean_score": 0.5,
                                   "pass@1": 0.5, "pass@2": 5 / 6, "pass@4": 1.0})
    assert overall == pytest.approx({"num_prompts": 3, "num_responses": 12, "mean_score": 0.25,
                                     "pass@1": 0.25, "pass@2": (0.5 + 0 + 5 / 6) / 3, "pass@4": 2 / 3})
    assert results["metrics"]["test_score/toy"] == pytest.approx(0.125)
    assert results["metrics"]["pass@2/other"] == pytest.approx(5 / 6)
    out = capsys.readouterr().out
    assert "overall" in out and "pass@4" in out and "gen.eval.json" in out


def test_reward_kwargs_threshold_and_output_path(files, tmp_path):
    data, reward = files
    out = tmp_path / "res" / "eval.json"
    # bonus 0.5 makes wrong answers score 0.5: still wrong under pass_threshold=1.0, right under 0.5
    base = [f"data.path={data}", f"custom_reward_function.path={reward}", "+custom_reward_function.reward_kwargs.bonus=0.5",
            f"data.output_path={out}"]
    assert main(base) == 0
    assert json.loads(out.read_text())["overall"]["pass@1"] == pytest.approx(0.25)
    assert main(base + ["pass_threshold=0.5"]) == 0
    assert json.loads(out.read_text())["overall"]["pass@1"] == pytest.approx(1.0)


def test_builtin_scorer_by_data_source(tmp_path):
    data = tmp_path / "gsm.parquet"
    write_parquet(data, [{"data_source": "openai/gsm8k", "responses": ["so #### 72", "#### 71"],
                          "reward_model": {"ground_truth": "72"}}])
    assert main([f"data.path={data}"]) == 0
    assert json.loads((tmp_path / "gsm.eval.json").read_text())["overall"]["pass@1"] == pytest.approx(0.5)


def test_raising_reward_is_reported_with_the_sample(files, capsys):
    data, reward = files
    rows = [dict(ROWS[0]), {**ROWS[2], "responses": ["x", "boom"]}]
    write_parquet(data, rows)
    assert main([f"data.path={data}", f"custom_reward_function.path={reward}"]) == 1
    err = capsys.readouterr().err
    assert "ZeroDivisionError: scorer bug" in err
    assert "row 1, response 1, data_source='other'" in err and "response: boom" in err and "ground_truth: x" in err
    assert not (data.parent / "gen.eval.json").exists()


def test_reward_function_with_wrong_signature(files, tmp_path, capsys):
    data, _ = files
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(text):\n    return 1.0\n")
    assert main([f"data.path={data}", f"custom_reward_function.path={bad}"]) == 1
    assert "must accept keyword arguments" in capsys.readouterr().err


def test_config_errors_name_the_key(files, capsys):
    data, _ = files
    with pytest.raises(ConfigError, match="did you mean data.response_key"):
        load_config(["data.responses_key=responses"], "evaluation", schema=EvalConfig)
    assert main([f"data.path={data}", "data.response_key=answers"]) == 2
    assert "data.response_key=answers" in capsys.readouterr().err
    assert main([]) == 2  # data.path is required
    cfg = load_config([], "evaluation", schema=EvalConfig)  # configs/evaluation.yaml matches the schema
    assert (cfg.data.response_key, cfg.custom_reward_function.name, cfg.pass_threshold) == ("responses", "compute_score", 1.0)


def test_module_command_line(files):
    data, reward = files
    out = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_eval", f"data.path={data}",
                          f"custom_reward_function.path={reward}"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert '"pass@4/toy": 0.5' in out.stdout
