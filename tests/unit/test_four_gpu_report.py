"""benchmarks/four_gpu.py's comparisons: which one-GPU run each multi-GPU run is divided by."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import four_gpu  # noqa: E402


def run(shape, gpus, tok, tag="", **extra):
    return {"shape": shape, "gpus": gpus, "tokens_per_s_per_gpu": tok, "tag": tag,
            "layout": {"tp": 1, "pp": 1, "tp_g": 1}, **extra}


def test_tagged_runs_fall_back_to_the_untagged_one_gpu_run_and_jobs_stay_apart():
    runs = {"1p5b_1gpu": run("1.5b", 1, 1000.0), "1p5b_dp4": run("1.5b", 4, 500.0),
            "1p5b_1gpu.noseed": run("1.5b", 1, 800.0, "noseed"), "1p5b_dp4.noseed": run("1.5b", 4, 600.0, "noseed"),
            "1p5b_big_1gpu": run("1.5b_big", 1, 2000.0), "1p5b_big_dp4": run("1.5b_big", 4, 1900.0),
            "7b_1gpu": run("7b", 1, 300.0), "7b_tp4.nofuse": run("7b", 4, 150.0, "nofuse"),
            "7b_tp2dp2.nofuse": run("7b", 4, 240.0, "nofuse", mfu_forward_backward=0.41),
            "7b_big_1gpu": run("7b_big", 1, 400.0), "7b_big_tp2dp2": run("7b_big", 4, 440.0, mfu_forward_backward=0.44)}
    m = four_gpu.comparisons(runs)
    assert m["dp4_scaling"] == 0.5
    assert m["dp4_scaling.noseed"] == 0.75  # its own tag's one-GPU run, not the untagged one
    assert m["dp4_scaling_big"] == 0.95
    assert m["tokens_per_s_per_gpu_7b_tp4.nofuse_vs_1gpu"] == 0.5  # no 7b_1gpu.nofuse: the untagged base
    assert m["tokens_per_s_per_gpu_7b_big_tp2dp2_vs_1gpu"] == 1.1  # the big job against the big job's one GPU
    assert m["train_mfu_7b_tp2dp2.nofuse"] == 0.41 and m["train_mfu_7b_big_tp2dp2"] == 0.44
