"""benchmarks/peer_verl: the report's parsing of both trainers' logs, its phase medians and ratios, and the
settings that generate both command lines (fake logs; no GPU, no verl)."""
import importlib.util
import json
import os

import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "peer_verl")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"peer_verl_{name}", os.path.join(HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _load("report")
settings = _load("settings")


def _write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


def _run_files(d, launched, first, ended, mem):
    for name, v in (("launched_at", launched), ("first_metrics_at", first), ("ended_at", ended)):
        with open(os.path.join(d, name), "w") as f:
            f.write(f"{v}\n")
    with open(os.path.join(d, "gpu_mem_mib.txt"), "w") as f:
        f.write("\n".join(str(m) for m in mem) + "\n")


def _verl_step(step, t, gen, upd_w, extra=None):
    data = {"timing_s/step": t, "timing_s/gen": gen, "timing_s/update_weights": upd_w, "timing_s/update_actor": 1.0,
            "perf/throughput": 1000.0 * step, "critic/score/mean": 0.01 * step, "perf/max_memory_allocated_gb": 7.5}
    return {"step": step, "data": {**data, **(extra or {})}}


@pytest.fixture
def runs(tmp_path):
    gsm = "val-core/openai/gsm8k/reward/mean@1"
    # verl's file logger nests metrics under "data"; its last step carries the final validation.
    _write(str(tmp_path / "verl_smol" / "metrics.jsonl"), [
        {"step": 0, "data": {gsm: 0.01, "val-aux/openai/gsm8k/acc/mean@1": 0.0}},
        _verl_step(1, 30.0, 20.0, 0.5), _verl_step(2, 4.0, 2.0, 0.4),
        _verl_step(3, 6.0, 3.0, 0.6, {gsm: 0.11, "val-aux/openai/gsm8k/acc/mean@1": 0.02})])
    _run_files(str(tmp_path / "verl_smol"), 100.0, 160.0, 300.0, [1000, 30000, 20480])
    # hybridrl: flat records, validation as its own rows, reshard inside gen.
    _write(str(tmp_path / "ours_smol" / "logs" / "metrics.jsonl"), [
        {"step": 0, gsm: 0.02, "val/score": 0.02, "timing_s/startup": 40.0},
        {"step": 1, "timing_s/step": 9.0, "timing_s/gen": 5.0, "timing_s/reshard": 0.03, "perf/throughput": 10.0},
        {"step": 2, "timing_s/step": 2.0, "timing_s/gen": 1.0, "timing_s/reshard": 0.02, "perf/throughput": 20.0},
        {"step": 3, "timing_s/step": 3.0, "timing_s/gen": 1.5, "timing_s/reshard": 0.04, "perf/throughput": 40.0},
        {"step": 3, gsm: 0.15, "val/score": 0.15}])
    _run_files(str(tmp_path / "ours_smol"), 10.0, 55.0, 100.0, [500, 10240])
    # 1.5B without validation: the first metrics line is step 1, whose time start-up must not count.
    _write(str(tmp_path / "verl_1p5b" / "metrics.jsonl"), [_verl_step(s, t, 1.0, 0.1) for s, t in
                                                             ((1, 50.0), (2, 10.0), (3, 12.0), (4, 14.0))])
    _run_files(str(tmp_path / "verl_1p5b"), 0.0, 170.0, 300.0, [2048])
    return tmp_path


def test_medians_ratios_val_and_startup(runs):
    result = report.compare(str(runs))
    v, o = result["jobs"]["smol"]["verl"], result["jobs"]["smol"]["ours"]
    assert v["steps"] == 3 and o["steps"] == 3
    assert v["step_s"] == pytest.approx(5.0) and o["step_s"] == pytest.approx(2.5)  # steps 2..N only
    assert result["headline"]["step_time_vs_verl"] == pytest.approx(0.5)
    assert v["update_weights_s"] == pytest.approx(0.5) and o["reshard_s"] == pytest.approx(0.03)
    assert o.get("update_weights_s") is None and v.get("reshard_s") is None  # never mixed across trainers
    assert v["tokens_per_s_per_gpu"] == pytest.approx(2500.0) and o["tokens_per_s_per_gpu"] == pytest.approx(30.0)
    assert (v["val_score_before"], v["val_score_after"]) == (pytest.approx(0.01), pytest.approx(0.11))
    assert (o["val_score_before"], o["val_score_after"]) == (pytest.approx(0.02), pytest.approx(0.15))
    assert v["val_acc_after"] == pytest.approx(0.02)
    assert v["startup_s"] == pytest.approx(60.0) and o["startup_s"] == pytest.approx(45.0)
    assert o["startup_own_s"] == pytest.approx(40.0)
    assert v["peak_gpu_mem_gib"] == pytest.approx(30000 / 1024) and v["trainer_max_allocated_gb"] == 7.5
    assert v["wall_s"] == pytest.approx(200.0)
    b = result["jobs"]["1p5b"]["verl"]
    assert b["startup_s"] == pytest.approx(120.0)  # 170 s to the first line, less step 1's 50 s
    assert b["step_s"] == pytest.approx(12.0) and "val_score_before" not in b
    assert "missing" in result["jobs"]["1p5b"]["ours"] and result["headline"]["step_time_vs_verl_1.5b"] is None


def test_report_files(runs, tmp_path):
    out = tmp_path / "peer_verl.json"
    report.main(["--runs", str(runs), "--out", str(out), "--device", "fake"])
    rec = json.loads(out.read_text())
    assert set(rec) == {"command", "device", "date", "metrics"}
    assert rec["metrics"]["step_time_vs_verl"] == pytest.approx(0.5)
    md = (tmp_path / "peer_verl.md").read_text()
    assert "| step (s/step) | 5.000 | 2.500 | 0.500 |" in md


def test_each_job_names_the_gpus_its_runs_used(runs, tmp_path):
    # the SmolLM2 pair and the 1.5B pair can come from different leases: each job says its own GPU
    for name, gpu in (("verl_smol", "H100"), ("ours_smol", "H100"), ("verl_1p5b", "H200")):
        (runs / name / "device.txt").write_text(f"NVIDIA {gpu}\n")
    out = tmp_path / "peer_verl.json"
    report.main(["--runs", str(runs), "--out", str(out)])
    assert json.loads(out.read_text())["device"] == "NVIDIA H100 / NVIDIA H200"
    md = (tmp_path / "peer_verl.md").read_text()
    smol, big = md.split("## random Qwen2-shaped 1.5B")
    assert "Device: NVIDIA H100\n" in smol and "different GPUs" not in smol
    assert "Device: NVIDIA H200\n" in big
    (runs / "ours_smol" / "device.txt").write_text("NVIDIA H200\n")
    report.main(["--runs", str(runs), "--out", str(out)])
    assert "**the two runs used different GPUs**" in (tmp_path / "peer_verl.md").read_text().split("## random")[0]


def test_settings_identical_on_both_sides():
    for job in settings.JOBS:
        ours = settings.overrides("ours", job, "/m", "/o")
        shared_o = [a for a in ours if a not in settings.side("ours", job, "/m", "/o")]
        for peer in ("verl", "verl_megatron"):
            verl = settings.overrides(peer, job, "/m", "/o")
            shared_v = [a for a in verl if a not in settings.side(peer, job, "/m", "/o")]
            assert shared_o == shared_v and len(shared_o) == len({**settings.SHARED, **settings.JOBS[job]})
        assert "actor_rollout_ref.rollout.enforce_eager=false" in shared_o
    assert "trainer.total_training_steps=7" in settings.overrides("verl", "smol", "/m", "/o", steps=7)
    assert "trainer.test_freq=7" in settings.overrides("ours", "smol", "/m", "/o", steps=7)


def _gens(d, step, rows):
    _write(os.path.join(d, "val_gens", f"{step}.jsonl"),
           [{"input": i, "output": o, "gts": "4", "score": s, "step": step} for i, o, s in rows])


def test_val_generations_compared_prompt_by_prompt(tmp_path):
    v, o = str(tmp_path / "verl_smol"), str(tmp_path / "ours_smol")
    # before: 3 prompts, outputs identical on 2; verl scored "#### 4" 0 (a broken reward path would look so)
    _gens(v, 0, [("p1", "#### 4", 0.0), ("p2", "x", 0.0), ("p3", "y", 0.0)])
    _gens(o, 0, [("p1", "#### 4", 1.0), ("p2", "x", 0.0), ("p3", "z", 0.0), ("p4", "w", 0.0)])
    _gens(v, 2, [("p1", "", 1.0), ("p2", "", 0.0), ("p3", "", 0.0)])  # gains 1, 0, 0
    _gens(o, 2, [("p1", "", 1.0), ("p2", "", 1.0), ("p3", "", 0.1)])  # gains 0, 1, 0.1
    check = report.val_generation_check(v, o, rescore=lambda out, gts: float(out == f"#### {gts}"))
    assert check["prompts_matched"] == 3 and check["prompts_ours"] == 4
    assert check["identical_outputs_before"] == pytest.approx(2 / 3)
    assert check["verl_score_before"] == 0.0 and check["ours_score_before"] == pytest.approx(1 / 3)
    assert check["verl_outputs_rescored_before"] == pytest.approx(1 / 3)
    assert check["reward_paths_agree"] is False  # verl gave "#### 4" 0 where the shared reward gives 1
    assert check["verl_val_gain"] == pytest.approx(1 / 3) and check["ours_val_gain"] == pytest.approx(1.1 / 3)
    # sample sd of (1, 0, 0) is sqrt(1/3); se = sd / sqrt(3) = 1/3
    assert check["verl_val_gain_se"] == pytest.approx(1 / 3)
    assert check["learning_parity"] is True


def test_resumed_verl_run_joins_its_parts_and_keeps_the_first_record_of_a_step(runs):
    d = runs / "verl_smol"
    # part 2 resumed from step 2's checkpoint: its step 3 repeats (a restart warm-up of 60 s), step 4 is new
    _write(str(d / "metrics.jsonl.2"), [_verl_step(3, 60.0, 1.0, 0.1), _verl_step(4, 8.0, 1.0, 0.1),
                                         {"step": 4, "data": {"val-aux/openai/gsm8k/reward/mean@1": 0.2}}])
    for name, v in (("launched_at.2", 1000.0), ("first_metrics_at.2", 1100.0), ("ended_at.2", 1150.0)):
        (d / name).write_text(f"{v}\n")
    v = report.summarize(str(d), "verl")
    assert v["steps"] == 4 and v["step_s"] == pytest.approx(6.0)  # steps 2..4: 4, 6 (first record), 8
    assert v["val_score_after"] == pytest.approx(0.2)  # verl 0.9.1's val-aux reward key
    assert v["wall_s"] == pytest.approx(200.0 + 150.0) and v["restarts"] == 1
    assert v["restart_startup_s"] == pytest.approx(100.0)


def test_verl_order_is_the_order_of_torchs_seeded_random_sampler(tmp_path):
    # verl draws prompts with a seeded RandomSampler (torchdata's, the same permutations as torch's without
    # replacement); its first epoch is the sampler's second pass (verl_order.py's docstring says how that was
    # found), and verl_order.py must write the rows in exactly that order
    import pandas as pd
    import torch
    from torch.utils.data import RandomSampler

    order = _load("verl_order")
    g = torch.Generator()
    g.manual_seed(1)
    two_passes = list(RandomSampler(range(300), num_samples=600, generator=g))  # the generator's permutations 0, 1
    first, expected = two_passes[:300], two_passes[300:]
    assert order.verl_order(300, 1) == expected and order.verl_order(300, 1, draw=0) == first != expected
    assert order.verl_order(300, 2) != expected
    src, out = tmp_path / "train.parquet", tmp_path / "o" / "train.parquet"
    pd.DataFrame({"row": list(range(300))}).to_parquet(src)
    order.main(["--data", str(src), "--seed", "1", "--out", str(out), "--expect-rows", "300"])
    assert pd.read_parquet(out)["row"].tolist() == expected
    with pytest.raises(SystemExit, match="verl kept 299"):
        order.main(["--data", str(src), "--out", str(out), "--expect-rows", "299"])


def test_verl_console_log_stands_in_for_a_lost_metrics_file(runs):
    # run.sh's NAME.log beside the run folder: Ray's colour prefix, numpy reprs, the line printed twice
    os.remove(runs / "verl_1p5b" / "metrics.jsonl")
    line = ("\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m step:{s} - actor/entropy:11.625 - num_turns/min:np.int32(2) - "
            "timing_s/step:{t} - perf/throughput:{p} - note:text\n")
    text = "noise step: none\n" + "".join(line.format(s=s, t=t, p=100.0 * s) * 2
                                          for s, t in ((1, 50.0), (2, 10.0), (3, 12.0), (4, 14.0)))
    (runs / "verl_1p5b.log").write_text(text)
    b = report.compare(str(runs))["jobs"]["1p5b"]["verl"]
    assert b["steps"] == 4 and b["step_s"] == pytest.approx(12.0) and b["metrics_from"] == "verl_1p5b.log"
    assert b["tokens_per_s_per_gpu"] == pytest.approx(300.0) and b["entropy_first"] == pytest.approx(11.625)
    assert report.compare(str(runs))["jobs"]["smol"]["verl"].get("metrics_from") is None


def test_learning_spread_lists_every_hybridrl_smol_run_with_what_sets_it_apart(runs, tmp_path):
    assert report.compare(str(runs))["spread"] == []  # one run a side: no spread table
    (runs / "ours_smol" / "command.txt").write_text("python3 -m hybridrl data.seed=1 lr=1e-05")
    for name, cmd, score in (("ours_smol_seed2", "python3 -m hybridrl data.seed=1 lr=1e-05 trainer.default_local_dir=/x data.seed=2", 0.2),
                             ("ours_smol_seed1", "python3 -m hybridrl data.seed=1 lr=1e-05 lr=2.5e-5", 0.3)):
        _write(str(runs / name / "logs" / "metrics.jsonl"), [
            {"step": 0, "val/score": 0.02}, {"step": 1, "timing_s/step": 2.0, "critic/score/mean": score},
            {"step": 1, "val/score": 0.02 + score}])
        (runs / name / "command.txt").write_text(cmd)
    rows = report.compare(str(runs))["spread"]
    assert [r["run"] for r in rows] == ["verl_smol", "ours_smol", "ours_smol_seed1", "ours_smol_seed2"]
    assert rows[2]["differs"] == ["lr=2.5e-5"] and rows[3]["differs"] == ["data.seed=2"]
    assert rows[3]["val_score_gain"] == pytest.approx(0.2) and rows[2]["train_score_last"] == pytest.approx(0.3)
    out = tmp_path / "peer_verl.json"
    report.main(["--runs", str(runs), "--out", str(out), "--device", "fake"])
    assert "| ours_smol_seed1 | lr=2.5e-5 | 0.300 |" in (tmp_path / "peer_verl.md").read_text()


def test_parity_is_judged_against_hybridrls_own_spread_when_several_data_orders_ran():
    rows = [{"run": "verl_smol", "differs": [], "val_score_gain": 0.099},
            {"run": "ours_smol", "differs": [], "val_score_gain": 0.084},
            {"run": "ours_smol_seed2", "differs": ["data.seed=2"], "val_score_gain": 0.076},
            {"run": "ours_smol_lr", "differs": ["actor_rollout_ref.actor.optim.lr=2.5e-5"], "val_score_gain": 0.102}]
    assert report.spread_parity(rows, 0.005) is None  # two data orders are not a spread; the lr run is not one
    rows.append({"run": "ours_smol_seed3", "differs": ["data.seed=3"], "val_score_gain": 0.075})
    # mean 0.0783, sd 0.0049 (with verl's se 0.005: 0.0070): verl is 0.0207 above, more than two of them
    assert report.spread_parity(rows, 0.005) is False
    rows[0]["val_score_gain"] = 0.090
    assert report.spread_parity(rows, 0.005) is True
