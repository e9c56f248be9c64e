"""Tracker: jsonl and tensorboard read back, wandb offline with no network, console format, redaction."""
import glob
import json
import math
import os

import pytest

from hybridrl.config.schema import TrainerConfig
from hybridrl.trainer import tracking
from hybridrl.trainer.tracking import REDACTED, Tracker, redact

FAKE_WANDB_KEY = "wandbkey-FAKE-0123456789abcdef0123456789abcdef"
FAKE_HF_TOKEN = "hf_FAKEtoken9876543210"
CONFIG = {
    "data": {"prompt_key": "prompt", "max_prompt_length": 512},
    "actor_rollout_ref": {"rollout": {"max_num_batched_tokens": 8192}, "model": {"hf_token": FAKE_HF_TOKEN}},
    "trainer": {"logger": ["console"], "wandb": {"WANDB_API_KEY": FAKE_WANDB_KEY}},
}


def steps():
    yield 1, {"critic/score/mean": 0.25, "actor/ppo_kl": 0.001, "timing_s/step": 2.0}
    yield 2, {"critic/score/mean": 0.75, "actor/ppo_kl": float("nan"), "timing_s/step": float("inf")}


def all_text_under(folder):
    out = []
    for path in glob.glob(os.path.join(folder, "**", "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out.append(f.read())
    return b"\n".join(out)


def test_redact_nested_and_keeps_schema_lookalikes():
    cfg = {"a": {"hf_token": "t", "WANDB_API_KEY": "k", "prompt_key": "prompt", "tokenizer": "/m",
                 "ppo_max_token_len_per_gpu": 16384, "list": [{"db_password": "p"}], "api_key": None},
           "client_secret": "s"}
    out = redact(cfg)
    assert out == {"a": {"hf_token": REDACTED, "WANDB_API_KEY": REDACTED, "prompt_key": "prompt", "tokenizer": "/m",
                         "ppo_max_token_len_per_gpu": 16384, "list": [{"db_password": REDACTED}], "api_key": None},
                   "client_secret": REDACTED}
    assert cfg["a"]["hf_token"] == "t"  # a copy: the caller's config is untouched


def test_jsonl_and_tensorboard_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(["jsonl", "tensorboard"], "p", "e", CONFIG, str(tmp_path))
    for step, metrics in steps():
        tracker.log(metrics, step)
    tracker.finish()
    tracker.finish()  # idempotent

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # strict JSON: no bare NaN tokens
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["critic/score/mean"] == 0.25
    assert records[1]["actor/ppo_kl"] == "nan" and math.isnan(float(records[1]["actor/ppo_kl"]))
    assert float(records[1]["timing_s/step"]) == math.inf

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("critic/score/mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.25), (2, 0.75)]
    kl = acc.Scalars("actor/ppo_kl")
    assert kl[0].value == pytest.approx(0.001) and math.isnan(kl[1].value)
    text = all_text_under(str(tmp_path))
    assert FAKE_HF_TOKEN.encode() not in text and FAKE_WANDB_KEY.encode() not in text
    assert b"max_num_batched_tokens" in text  # the (redacted) config did go to tensorboard


def test_console_line_order_and_summary(capsys):
    tracker = Tracker("console", "p", "e", {}, "unused")
    metrics = {"timing_s/step": 2.0, "zzz/other": 1.0, "actor/ppo_kl": float("nan"), "response_length/mean": 100.0,
               "val-core/gsm8k/reward/mean@1": 0.5, "critic/score/mean": 0.5}
    tracker.log(metrics, 1)
    tracker.log(dict(reversed(list(metrics.items()))), 2)  # insertion order must not matter
    tracker.finish()
    out = capsys.readouterr().out.splitlines()
    expected = ("score 0.5 | val-core/gsm8k/reward/mean@1 0.5 | resp_len 100 | ppo_kl nan | step_s 2 | (+1 metrics)")
    assert out[0] == "step 1 | " + expected
    assert out[1] == "step 2 | " + expected
    assert "run summary" in out
    header = out[out.index("run summary") + 1].split()
    assert header == ["metric", "first", "last", "min", "max", "n"]
    row = next(line for line in out if line.startswith("critic/score/mean")).split()
    assert row[1:] == ["0.5", "0.5", "0.5", "0.5", "2"]
    kl_row = next(line for line in out if line.startswith("actor/ppo_kl")).split()
    assert kl_row[1:] == ["nan", "nan", "nan", "nan", "2"]


def test_unknown_logger_names_the_key():
    with pytest.raises(ValueError, match=r"trainer.logger.*'mlflow'"):
        Tracker(["console", "mlflow"], "p", "e", {}, "unused")


def test_non_numeric_metric_names_it(tmp_path):
    tracker = Tracker(["jsonl"], "p", "e", {}, str(tmp_path))
    with pytest.raises(TypeError, match="actor/oops"):
        tracker.log({"actor/oops": "high"}, 1)


def test_wandb_mode_rules(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setattr(tracking, "_reachable", lambda *a: pytest.fail("no key: must not probe the network"))
    assert tracking.wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", FAKE_WANDB_KEY)
    monkeypatch.setattr(tracking, "_reachable", lambda *a: False)
    assert tracking.wandb_mode() == "offline"
    monkeypatch.setattr(tracking, "_reachable", lambda *a: True)
    assert tracking.wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.wandb_mode() == "disabled"


def test_reachable_probe_is_bounded():
    # a closed local port answers at once; the probe must say so, not hang or raise
    assert tracking._reachable("127.0.0.1", 1, 1.0) is False


def test_wandb_offline_run_without_network_or_secrets(tmp_path, monkeypatch, capfd):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_WANDB_KEY)
    monkeypatch.setattr(tracking, "_reachable", lambda *a: False)  # as on a machine without network
    tracker = Tracker(["wandb", "console"], "proj", "exp", CONFIG, str(tmp_path))
    assert tracker.backends["wandb"].mode == "offline"
    for step, metrics in steps():
        tracker.log(metrics, step)
    tracker.finish()
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1 and glob.glob(os.path.join(runs[0], "*.wandb"))
    out, err = capfd.readouterr()
    for secret in (FAKE_WANDB_KEY, FAKE_HF_TOKEN):
        assert secret not in out and secret not in err
        assert secret.encode() not in all_text_under(str(tmp_path))
    assert b"max_prompt_length" in all_text_under(str(tmp_path))  # the config itself was recorded


def test_from_trainer_config(tmp_path):
    cfg = TrainerConfig(logger=["jsonl"], default_local_dir=str(tmp_path / "ckpt"))
    tracker = Tracker.from_config(cfg, {})
    tracker.log({"x": 1}, 3)
    tracker.finish()
    assert json.loads((tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text()) == {"step": 3, "x": 1.0}
