"""The files a config names are checked before start-up (hybridrl/config/preflight.py): each mistake a new user
made in issue 35 is one line naming the key or file to fix, in-process and without a model load."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.config import load_config, validate
from hybridrl.config.loader import ConfigError
from hybridrl.config.preflight import check_inputs

ROW = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "1+2="}], "ability": "a",
       "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"index": 0}}


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    (model / "model.safetensors").write_bytes(b"0")  # only its presence is checked here
    (model / "tokenizer.json").write_text("{}")
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([ROW] * 3), data)
    pq.write_table(pa.Table.from_pylist([ROW] * 3), tmp_path / "val.parquet")
    return {"model": model, "data": data, "val": tmp_path / "val.parquet", "root": tmp_path}


def check(files, *overrides):
    cfg = load_config([f"data.train_files={files['data']}", f"data.val_files={files['val']}",
                              f"actor_rollout_ref.model.path={files['model']}", *overrides], "demo")
    check_inputs(validate(cfg))


def one_line_error(files, *overrides) -> str:
    with pytest.raises(ConfigError) as err:
        check(files, *overrides)
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_good_inputs_pass(files):
    check(files)


def test_model_folder_mistakes_name_the_key_and_the_problem(files):
    model = files["model"]
    (model / "tokenizer.json").unlink()
    assert "no tokenizer files" in one_line_error(files) and "data.tokenizer" in one_line_error(files)
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text("{bad")
    assert f"{model}/config.json: not valid JSON" in one_line_error(files)
    (model / "config.json").unlink()
    assert "no config.json" in one_line_error(files)
    for f in model.iterdir():
        f.unlink()
    msg = one_line_error(files)
    assert msg.startswith(f"actor_rollout_ref.model.path={model}: the folder is empty") and "safetensors" not in msg.split(";")[0]


def test_a_missing_critic_path_names_critic_model_path(files):
    msg = one_line_error(files, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2")
    assert msg.startswith("critic.model.path=~/models/") and "the key is not set" in msg


def test_lengths_over_max_position_embeddings(files):
    msg = one_line_error(files, "data.max_response_length=60")
    assert "data.max_prompt_length=16 + data.max_response_length=60 = 76" in msg and "max_position_embeddings=64" in msg


@pytest.mark.parametrize("rows,words", [
    ([{k: v for k, v in ROW.items() if k != "reward_model"}], "has no 'reward_model' column"),
    ([{**ROW, "reward_model": {"style": "rule", "ground_truth": {"x": 1}}}], "row 0: reward_model.ground_truth is a dict"),
    ([{k: v for k, v in ROW.items() if k != "data_source"}], "set data.reward_fn_key"),
])
def test_data_columns_and_types(files, rows, words):
    pq.write_table(pa.Table.from_pylist(rows), files["data"])
    assert words in one_line_error(files)


def test_a_data_folder_is_named_as_a_folder(files):
    msg = one_line_error(files, f"data.train_files={files['root']}")
    assert msg.startswith(f"data.train_files: {files['root']} is a folder") and "extension" not in msg


def test_reward_function_signature(files):
    fn = files["root"] / "reward.py"
    fn.write_text("def compute_score(solution_str):\n    return 0.0\n")
    msg = one_line_error(files, f"custom_reward_function.path={fn}")
    assert "must accept keyword arguments" in msg and "compute_score(solution_str)" in msg


def test_a_custom_dataset_class_reads_its_own_files(files):
    cls = files["root"] / "my_dataset.py"
    cls.write_text("class D:\n    pass\n")
    check(files, f"data.train_files={files['root'] / 'rows.txt'}", f"data.custom_cls.path={cls}", "data.custom_cls.name=D")
