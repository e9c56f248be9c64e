"""benchmarks/peer_verl/settings.py (issue 34): every (trainer, job) gives a well-formed override list, the
workload is the same for every trainer, each backend gets the settings the README promises, and --padded gives
back issue 18's command lines. verl's own acceptance of these lists is checked by check_verl_config.py (it needs
verl's site: README.md "CPU checks"), not here."""
import importlib.util
import os

import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "peer_verl")
spec = importlib.util.spec_from_file_location("peer_verl_settings", os.path.join(HERE, "settings.py"))
settings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(settings)
ARA = "actor_rollout_ref"


def _pairs(args):
    """{key: value} of the Hydra overrides (the hybridrl --config-name pair and group overrides included)."""
    out, i = {}, 0
    while i < len(args):
        if args[i] == "--config-name":
            out["--config-name"] = args[i + 1]
            i += 2
            continue
        key, eq, value = args[i].partition("=")
        assert eq and key and " " not in key, args[i]
        assert key not in out, f"{key} given twice"
        out[key] = value
        i += 1
    return out


@pytest.mark.parametrize("gib", [80.0, 141.0])
@pytest.mark.parametrize("job", sorted(settings.JOBS))
@pytest.mark.parametrize("trainer", settings.TRAINERS)
def test_every_override_list_is_well_formed(trainer, job, gib):
    kv = _pairs(settings.overrides(trainer, job, "/m", "/o", gpu_gib=gib))
    assert int(kv["trainer.n_gpus_per_node"]) == settings.GPUS[job]
    assert kv[f"{ARA}.actor.use_dynamic_bsz"] == "true"  # every backend cuts micro-batches by tokens (issue 34)
    assert not any("{model}" in v for v in kv.values())
    if trainer == "verl_megatron":
        assert kv["model_engine"] == "megatron" and kv[f"{ARA}.actor.megatron.vanilla_mbridge"] == "true"
        assert kv[f"{ARA}.actor.megatron.override_transformer_config.attention_backend"] == "fused"
        assert kv[f"{ARA}.model.use_remove_padding"] == "true"
    if trainer == "verl":  # no flash-attn on the host: verl's FSDP cannot pack
        assert kv[f"{ARA}.model.use_remove_padding"] == "false" and kv[f"{ARA}.actor.strategy"] == "fsdp"
    if trainer == "ours":
        assert kv[f"{ARA}.model.use_remove_padding"] == "true"
        assert (kv.get(f"{ARA}.actor.load_weight") == "false") == job.startswith("7b")


def test_the_4gpu_layout_is_tp2_dp2_with_vllm_tp2_dp2_on_both_megatron_sides():
    for trainer in ("ours", "verl_megatron"):
        kv = _pairs(settings.overrides(trainer, "7b_4gpu", "/m", "/o"))
        assert kv[f"{ARA}.actor.megatron.tensor_model_parallel_size"] == "2"
        assert kv[f"{ARA}.rollout.tensor_model_parallel_size"] == "2" and kv["trainer.n_gpus_per_node"] == "4"
    fsdp = _pairs(settings.overrides("verl", "7b_4gpu", "/m", "/o"))
    assert fsdp[f"{ARA}.rollout.tensor_model_parallel_size"] == "2"


def test_one_gpu_7b_offloads_and_recompute_on_both_sides():
    ours = _pairs(settings.overrides("ours", "7b", "/m", "/o", gpu_gib=141))
    verl = _pairs(settings.overrides("verl_megatron", "7b", "/m", "/o", gpu_gib=141))
    assert f"{ARA}.actor.megatron.param_offload" not in verl  # the host (125 GiB) could not hold it beside the optimizer
    assert ours[f"{ARA}.model.enable_gradient_checkpointing"] == "true"
    assert verl[f"{ARA}.actor.megatron.override_transformer_config.recompute_granularity"] == "full"
    assert ours[f"{ARA}.actor.megatron.optimizer_offload"] == verl[f"{ARA}.actor.megatron.optimizer_offload"] == "true"
    assert ours[f"{ARA}.actor.ppo_max_token_len_per_gpu"] == verl[f"{ARA}.actor.ppo_max_token_len_per_gpu"] == "4096"


def test_padded_is_issue_18s_setting():
    for trainer in ("ours", "verl"):
        for job in ("smol", "1p5b"):
            kv = _pairs(settings.overrides(trainer, job, "/m", "/o", padded=True))
            assert kv[f"{ARA}.model.use_remove_padding"] == "false" and kv[f"{ARA}.actor.use_dynamic_bsz"] == "false"
            assert kv[f"{ARA}.model.enable_gradient_checkpointing"] == "false"
    with pytest.raises(ValueError):
        settings.overrides("verl_megatron", "smol", "/m", "/o", padded=True)


def test_main_prints_one_override_a_line(capsys):
    settings.main(["verl_megatron", "1p5b", "--model", "/m", "--out", "/o"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "model_engine=megatron" and "actor_rollout_ref.model.path=/m" in lines
    settings.main(["ours", "7b_4gpu", "--model", "/m", "--out", "/o", "--gpus"])
    assert capsys.readouterr().out.strip() == "4"


# ---------------------------------------------------------------------------- report.py --megatron (issue 34)
import json  # noqa: E402

rspec = importlib.util.spec_from_file_location("peer_verl_report_mc", os.path.join(HERE, "report.py"))
report = importlib.util.module_from_spec(rspec)
rspec.loader.exec_module(report)


def _lines(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


def _times(d, launched, first, ended, mem):
    for name, v in (("launched_at", launched), ("first_metrics_at", first), ("ended_at", ended)):
        with open(os.path.join(d, name), "w") as f:
            f.write(f"{v}\n")
    with open(os.path.join(d, "gpu_mem_mib.txt"), "w") as f:  # 4 GPUs sampled together: the fullest one counts
        f.write("\n".join(str(m) for m in mem) + "\n")


def test_megatron_report_ratios_phases_and_a_failed_run(tmp_path):
    verl = [{"step": s, "data": {"timing_s/step": t, "timing_s/gen": 4.0, "timing_s/update_weights": 0.8,
                                 "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 3.0, "timing_s/reward": 0.2,
                                 "timing_s/adv": 0.1, "perf/throughput": 900.0}} for s, t in ((1, 60.0), (2, 10.0), (3, 12.0))]
    _lines(str(tmp_path / "verl_megatron_1p5b" / "metrics.jsonl"), verl)
    _times(str(tmp_path / "verl_megatron_1p5b"), 0.0, 260.0, 400.0, [1000, 60000, 50000, 2000])
    ours = [{"step": s, "timing_s/step": t, "timing_s/gen": 3.0, "timing_s/reshard": 0.2, "timing_s/old_log_prob": 0.5,
             "timing_s/update_actor": 2.0, "perf/throughput": 2000.0} for s, t in ((1, 20.0), (2, 6.0), (3, 5.0))]
    _lines(str(tmp_path / "ours_best_1p5b" / "logs" / "metrics.jsonl"), ours)
    _times(str(tmp_path / "ours_best_1p5b"), 0.0, 80.0, 120.0, [40000])
    # verl's 7B run died before its first step: the report names the error from its log
    os.makedirs(tmp_path / "verl_megatron_7b")
    (tmp_path / "verl_megatron_7b.log").write_text("starting\nUserWarning: something\n"
                                                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    out = tmp_path / "res" / "peer_verl_megatron.json"
    report.main(["--megatron", "--runs", str(tmp_path), "--out", str(out)])
    rec = json.loads(out.read_text())
    m = rec["metrics"]
    assert m["step_time_vs_verl_megatron_1.5b"] == pytest.approx(5.5 / 11.0)
    assert m["step_time_vs_verl_megatron_1.5b_meets_0.8"] is True
    assert m["step_time_vs_verl_megatron_7b"] is None and m["step_time_vs_verl_fsdp_7b_4gpu"] is None
    pair = m["pairs"]["step_time_vs_verl_megatron_1.5b"]
    assert pair["verl"]["sync_s"] == pytest.approx(0.8) and pair["ours"]["sync_s"] == pytest.approx(0.2)
    assert pair["verl"]["reward_adv_s"] == pytest.approx(0.3)
    assert pair["verl"]["peak_gpu_mem_gib"] == pytest.approx(60000 / 1024)
    assert any("OutOfMemoryError" in ln for ln in m["failures"]["verl_megatron_7b"])
    md = (tmp_path / "res" / "peer_verl_megatron.md").read_text()
    assert "| weight sync (s; verl update_weights, hybridrl reshard) | 0.800 | 0.200 |" in md
    assert "verl_megatron_7b: **no timed steps**" in md and "CUDA out of memory" in md


# ---------------------------------------------------------------------------- run.sh's command lines (DRY=1)
import subprocess  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.parametrize("mode,expect,absent", [
    ("verl_megatron_7b_4gpu", ["CUDA_VISIBLE_DEVICES=0,1,2,3", "CUDA_DEVICE_MAX_CONNECTIONS=1", "model_engine=megatron",
                               "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], ["--padded"]),
    ("ours_7b", ["CUDA_VISIBLE_DEVICES=0", "hybridrl.trainer.main_ppo", "actor_rollout_ref.actor.load_weight=false",
                 "actor_rollout_ref.model.use_remove_padding=true"], ["model_engine"]),
    ("ours_1p5b", ["actor_rollout_ref.model.use_remove_padding=false", "actor_rollout_ref.actor.use_dynamic_bsz=false"],
     ["use_dynamic_bsz=true"]),  # issue 18's mode keeps its padded settings
])
def test_run_sh_dry_commands(tmp_path, mode, expect, absent):
    proc = subprocess.run(["bash", "benchmarks/peer_verl/run.sh", mode], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DRY": "1", "OUT": str(tmp_path)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for e in expect:
        assert e in proc.stdout, (e, proc.stdout)
    for a in absent:
        assert a not in proc.stdout
