"""The `hybridrl` command's own mistakes: no subcommand is an error with the usage, a flag without its value says
which value, and `plan` never plans for verl's placeholder model without saying so."""
import pytest

from hybridrl.__main__ import main as hybridrl_main
from hybridrl.config.cli import normalize_argv


def test_no_subcommand_prints_usage_and_exits_2(capsys):
    assert hybridrl_main([]) == 2
    err = capsys.readouterr().err
    assert "a subcommand is required" in err and "usage: hybridrl SUBCOMMAND" in err
    assert hybridrl_main(["--help"]) == 0


@pytest.mark.parametrize("argv", [["--preset"], ["--preset", "--config", "x.yaml"], ["--config"],
                                  ["--preset", "trainer.total_epochs=1"]])
def test_a_flag_without_its_value_names_it(argv, capsys):
    with pytest.raises(SystemExit) as err:
        normalize_argv(argv)
    assert err.value.code == 2 and f"{argv[0]} needs a value" in capsys.readouterr().err
    assert normalize_argv(["--preset", "7b_8gpu"]) == ["preset=7b_8gpu"]


def test_plan_refuses_the_placeholder_model(capsys):
    assert hybridrl_main(["plan", "--preset", "7b_8gpu"]) == 2
    err = capsys.readouterr().err
    assert "no model to plan for" in err and "--model-config" in err and "deepseek-llm-7b-chat" in err


def test_main_generation_suggests_only_keys_it_reads(capsys):
    from hybridrl.trainer import main_generation

    assert main_generation.main(["rollout.val_kwargs.tempreture=1"]) == 2
    msg = capsys.readouterr().err
    assert "did you mean rollout.temperature" in msg and "val_kwargs.temperature" not in msg


def test_main_generation_names_an_empty_model_folder_in_one_line(tmp_path, capsys):
    from hybridrl.trainer import main_generation

    with pytest.raises(SystemExit) as err:
        main_generation.main([f"model.path={tmp_path}", f"data.path={tmp_path / 'x.parquet'}", "trainer.device=cpu"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert err.value.code == 2 and lines == [f"hybridrl: model.path={tmp_path}: no config.json, so not a HuggingFace "
                                             "model folder (the folder is empty)"]


def test_main_generation_never_overwrites_a_file_unasked(tmp_path, capsys):
    from hybridrl.trainer import main_generation

    data, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    data.write_bytes(b"input")
    out.write_bytes(b"earlier")
    base = [f"model.path={tmp_path / 'nomodel'}", f"data.path={data}", "trainer.device=cpu"]
    assert main_generation.main(base + [f"data.output_path={out}"]) == 2
    assert main_generation.main(base + [f"data.output_path={data}"]) == 2
    err = capsys.readouterr().err
    assert "exists; give a new path, or set data.overwrite_output=true" in err and "is the input data.path" in err
    assert data.read_bytes() == b"input" and out.read_bytes() == b"earlier"
    with pytest.raises(SystemExit):  # allowed now: it goes on to the model, which is missing
        main_generation.main(base + [f"data.output_path={out}", "data.overwrite_output=true"])
    assert "nomodel: not a local folder" in capsys.readouterr().err
