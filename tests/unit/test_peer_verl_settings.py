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
