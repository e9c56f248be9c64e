"""End-of-run plot from the tracker's jsonl, and the progress bar's on/off rules."""
import io
import math

import matplotlib.image as mpimg
import pytest

from hybridrl.config.schema import TrainerConfig
from hybridrl.trainer.plot import plot_history, read_history
from hybridrl.trainer.progress import ProgressBar
from hybridrl.trainer.tracking import Tracker


def write_history(log_dir):
    tracker = Tracker(["jsonl"], "p", "e", {}, str(log_dir))
    for step in (1, 2, 3, 4):
        m = {"critic/score/mean": 0.1 * step, "response_length/mean": 100.0 + step, "actor/ppo_kl": 0.01 * step,
             "actor/kl_loss": 0.02 * step}
        if step == 2:
            m["actor/ppo_kl"] = float("nan")
        if step % 2 == 0:
            m["val-core/openai/gsm8k/reward/mean@1"] = 0.2 * step
        tracker.log(m, step)
    tracker.log({"critic/score/mean": 0.9, "response_length/mean": 50.0, "actor/ppo_kl": 0.5}, 3)  # resumed: wins
    tracker.finish()
    return log_dir / "metrics.jsonl"


def lines_of(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_plot_panels_and_data(tmp_path):
    jsonl = write_history(tmp_path)
    out = tmp_path / "history.png"
    axes = plot_history(str(jsonl), str(out), title="demo")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert mpimg.imread(str(out)).shape[:2] == (900, 800)  # 3 panels of 8x3 inches at 100 dpi
    assert len(axes) == 3

    score = lines_of(axes[0])
    assert score["critic/score/mean"] == ([1, 2, 3, 4], pytest.approx([0.1, 0.2, 0.9, 0.4]))
    assert score["val-core/openai/gsm8k/reward/mean@1"] == ([2, 4], pytest.approx([0.4, 0.8]))
    assert lines_of(axes[1])["response_length/mean"][1] == pytest.approx([101, 102, 50, 104])
    kl = lines_of(axes[2])
    assert set(kl) == {"actor/ppo_kl", "actor/kl_loss"}
    xs, ys = kl["actor/ppo_kl"]
    assert xs == [1, 2, 3, 4] and math.isnan(ys[1]) and ys[2] == 0.5  # NaN is a gap, not a crash
    assert kl["actor/kl_loss"][0] == [1, 2, 4]  # the resumed step 3 record has no kl_loss
    assert read_history(str(jsonl))[3]["critic/score/mean"] == 0.9


def test_plot_with_missing_panels(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"step": 1, "critic/score/mean": 0.5}\n')
    axes = plot_history(str(tmp_path / "m.jsonl"), str(tmp_path / "p.png"))
    assert [len(ax.get_lines()) for ax in axes] == [1, 0, 0]
    assert "not logged" in [t.get_text() for t in axes[2].texts]


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_shows_score_on_a_tty():
    stream = FakeTTY()
    bar = ProgressBar(total_steps=10, initial_step=2, stream=stream)
    bar.update(3, {"critic/score/mean": 0.5, "timing_s/step": 1.25})
    bar.close()
    text = stream.getvalue()
    assert bar.enabled and "3/10" in text and "score=0.500" in text and "step_s=1.2" in text


def test_progress_bar_off_when_not_a_tty_or_disabled():
    plain = io.StringIO()
    bar = ProgressBar(10, stream=plain)
    bar.update(1, {"critic/score/mean": 0.5})
    bar.close()
    assert not bar.enabled and plain.getvalue() == ""
    off = ProgressBar.from_config(TrainerConfig(progress_bar=False), 10)
    assert not off.enabled and off.bar is None
