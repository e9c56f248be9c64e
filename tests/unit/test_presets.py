"""Parallelism presets (configs/parallel/): each loads, validates to its stated layout, sets only keys that
differ from the defaults, and fits its model on its GPUs according to the memory plan."""
from __future__ import annotations

import json
import os
import shlex

import pytest
import yaml

from hybridrl.config import load_config, to_dict, validate
from hybridrl.config.cli import normalize_argv
from hybridrl.config.loader import PRESET_DIR
from hybridrl.plan import GiB, estimate, fit_problems, resolve, shape_problems
from hybridrl.plan.cli import main as plan_main

TINY = "tiny"  # replaced by a config.json written in the test
# name: (model, GPU GiB, (world, tp, pp, dp, rollout tp))
PRESETS = {
    "0.5b_1gpu": ("Qwen2.5-0.5B", 24, (1, 1, 1, 1, 1)),
    "1.5b_2gpu": ("Qwen2.5-1.5B", 40, (2, 1, 1, 2, 1)),
    "7b_8gpu": ("Qwen2.5-7B", 80, (8, 2, 1, 4, 2)),
    "7b_8gpu_tp2pp2": ("Qwen2.5-7B", 80, (8, 2, 2, 2, 2)),
    "32b_16gpu": ("Qwen2.5-32B", 80, (16, 4, 2, 2, 4)),
    "70b_32gpu": ("Llama-3-70B", 80, (32, 8, 2, 2, 8)),
    "qwen3_30b_a3b_8gpu": ("Qwen3-30B-A3B", 141, (8, 2, 1, 4, 2)),
    "qwen3_30b_a3b_16gpu": ("Qwen3-30B-A3B", 141, (16, 2, 2, 4, 2)),
    "cpu_2proc": (TINY, None, (2, 1, 1, 2, 1)),
    "cpu_4proc": (TINY, None, (4, 2, 2, 1, 1)),
}
GPU = lambda: True  # noqa: E731


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}))
    return str(path)


@pytest.fixture(scope="module")
def defaults():
    return to_dict(load_config([]))


def _leaves(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _lookup(tree, dotted):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_every_preset_on_disk_is_listed_here():
    on_disk = {f[:-5] for f in os.listdir(PRESET_DIR) if f.endswith(".yaml")}
    assert on_disk == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_sets_only_keys_that_differ_and_explains_itself(name, defaults):
    path = os.path.join(PRESET_DIR, f"{name}.yaml")
    text = open(path).read()
    header = [line for line in text.splitlines() if line.startswith("#")]
    for word in (f"Preset {name}:", "Why:", "Layout:", "Check: hybridrl plan"):
        assert any(word in line for line in header), f"{name}: header lacks {word!r}"
    for key, value in _leaves(yaml.safe_load(text)):
        assert _lookup(defaults, key) != value, f"{name}: {key}={value!r} is the default; leave it out"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_check_line_plans_and_fits(name, tiny_model, capsys):
    """The header's `Check:` command: loads the preset, validates it and plans its model without refusal."""
    text = open(os.path.join(PRESET_DIR, f"{name}.yaml")).read()
    check = next(line for line in text.splitlines() if line.startswith("# Check: hybridrl plan "))
    argv = [tiny_model if a == "PATH/TO/tiny-model" else a for a in shlex.split(check[len("# Check: hybridrl plan "):])]
    code = plan_main([*argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out["problems"]
    model, gpu_gib, (world, tp, pp, dp, rollout_tp) = PRESETS[name]
    lay = out["layout"]
    assert (lay["world_size"], lay["tp"], lay["pp"], lay["dp"], lay["rollout_tp"]) == (world, tp, pp, dp, rollout_tp)
    assert out["model"]["name"] == (model if model != TINY else os.path.basename(tiny_model))
    if gpu_gib is not None:
        assert out["gpu_memory_bytes"] == gpu_gib * GiB and lay["device"] == "cuda"
    else:
        assert lay["device"] == "cpu" and lay["rollout_engine"] == "torch"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_fits_grpo(name, tiny_model):
    """The same presets under verl's GRPO config (reference model, n=5 samples, no critic)."""
    model, gpu_gib, (world, tp, pp, dp, rollout_tp) = PRESETS[name]
    run = validate(load_config([f"+preset={name}"], config_name="grpo_trainer"), cuda_available=GPU)
    a = run.derived.actor
    assert (a.world_size, a.tp, a.pp, a.dp, run.derived.rollout.tp) == (world, tp, pp, dp, rollout_tp)
    assert run.derived.use_reference and not run.derived.use_critic
    shape = resolve(tiny_model if model == TINY else model)
    plan = estimate(run, shape, (gpu_gib or 80) * GiB)
    assert shape_problems(run, shape) + fit_problems(plan, run, shape) == []


def test_70b_preset_also_fits_qwen_72b():
    run = validate(load_config(["preset=70b_32gpu"]), cuda_available=GPU)
    shape = resolve("Qwen2.5-72B")
    assert shape_problems(run, shape) + fit_problems(estimate(run, shape, 80 * GiB), run, shape) == []


def test_train_preset_flag_spelling():
    """`hybridrl train --preset NAME` reaches the same preset as `preset=NAME`."""
    argv = normalize_argv(["--preset", "7b_8gpu_tp2pp2", "trainer.nnodes=2"])
    run = validate(load_config(argv), cuda_available=GPU)
    assert (run.derived.world_size, run.derived.actor.tp, run.derived.actor.pp, run.derived.actor.dp) == (16, 2, 2, 4)
