"""Start-up: the parts a user waits for add up, and vLLM's CUDA graphs are fitted to the rollout batch."""
import contextlib
import logging

import pytest

from hybridrl.config import load_config, validate
from hybridrl.rollout.vllm_engine import CAPTURE_GRID, _StartupLog, capture_sizes
from hybridrl.trainer.components import max_rollout_rows
from hybridrl.utils import startup
from hybridrl.utils.startup import ENGINE_PARTS, StartupClock, engine_parts, phase_table


def test_capture_sizes_follow_vllms_grid_up_to_the_batch():
    assert capture_sizes(None, 1024) is None  # unknown: vLLM's own list
    assert capture_sizes(1, 1024) == [1]
    assert capture_sizes(64, 1024) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    # a batch between grid points gets the next one up, so the largest batch still runs in a graph
    assert capture_sizes(100, 1024)[-3:] == [88, 96, 104]
    assert capture_sizes(300, 1024)[-2:] == [288, 304]
    # never more than vLLM's default list (512 at most), and never above max_num_seqs
    assert capture_sizes(5000, 1024) == CAPTURE_GRID and CAPTURE_GRID[-1] == 512
    assert capture_sizes(5000, 48)[-1] == 48
    assert len(capture_sizes(512, 1024)) == 51


def _run(*extra):
    return validate(load_config(["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", *extra],
                                config_name="grpo_trainer"), cuda_available=lambda: True)


def test_max_rollout_rows_is_the_larger_of_a_train_and_a_val_call_per_replica():
    run = _run("actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    assert run.derived.rollout.dp == 2
    assert max_rollout_rows(run, n_val=100) == 32 * 8  # 64 prompts / 2 replicas x n=8
    assert max_rollout_rows(run, n_val=1000) == 500  # the whole validation set in one call, n=1
    capped = _run("actor_rollout_ref.rollout.n=8", "data.val_batch_size=10", "actor_rollout_ref.rollout.val_kwargs.n=4",
                  "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    assert max_rollout_rows(capped, n_val=1000) == 256  # val batches of 10 -> 5 per replica x 4 < 256
    odd = _run("actor_rollout_ref.rollout.n=3", "trainer.n_gpus_per_node=3", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
               "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
               "data.train_batch_size=16", "actor_rollout_ref.rollout.val_kwargs.n=5")
    assert max_rollout_rows(odd, n_val=7) == 6 * 3  # ceil(16 / 3) x n=3; 7 val prompts -> ceil(7/3)=3 x 5 = 15


@pytest.fixture
def clock_time(monkeypatch):
    """startup.py's perf_counter moves only when the test says (sleep-based timings flaked on a loaded CI)."""
    fake = _Clock()
    monkeypatch.setattr(startup.time, "perf_counter", fake)
    return fake


def test_startup_clock_parts_add_up_to_the_total(clock_time):
    clock = StartupClock()
    clock_time.now += 0.02
    clock.lap("data")
    clock_time.now += 0.05  # the worker's init call: 0.03 s its own parts, the rest its overhead
    clock.add_worker({"actor_build": 0.01, "engine_init": 0.02, "engine_compile": 0.015, "first_sync": 0.0,
                      "unrelated": 9.0})
    clock_time.now += 0.01
    m = clock.done()
    parts = {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/startup/")}
    assert set(parts) == {"launch", "data", "actor_build", "engine_init", "engine_compile", "first_sync",
                          "worker_init", "other"}
    assert parts["data"] == pytest.approx(0.02, abs=1e-9)
    assert parts["worker_init"] == pytest.approx(0.05 - 0.03, abs=1e-9)  # init wall minus its listed parts
    assert parts["other"] == pytest.approx(0.01, abs=1e-9)
    # engine_compile is inside engine_init: the total is the sum of the top-level parts only
    top = sum(v for k, v in parts.items() if k != "engine_compile")
    assert top == pytest.approx(m["timing_s/startup"], rel=1e-9)
    assert clock.done() == m  # later calls repeat the first
    assert clock.summary().startswith(f"hybridrl: start-up {m['timing_s/startup']:.1f} s")


def test_host_pinning_in_the_background_is_listed_but_only_its_wait_adds_up(clock_time):
    """The actor pins its offload arenas on a thread (host_pin_background) while the start-up goes on; what the
    start-up waited for them (host_pin_wait) is a part of the worker's init like actor_build."""
    clock = StartupClock()
    clock_time.now += 0.04
    clock.add_worker({"actor_build": 0.01, "host_pin_wait": 0.02, "host_pin_background": 5.0, "first_sync": 0.0})
    m = clock.done()
    parts = {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/startup/")}
    assert parts["host_pin_wait"] == 0.02 and parts["host_pin_background"] == 5.0
    assert parts["worker_init"] == pytest.approx(0.04 - 0.03, abs=1e-9)
    top = sum(v for k, v in parts.items() if k != "host_pin_background")
    assert top == pytest.approx(m["timing_s/startup"], rel=1e-9)
    assert "host_pin_background" not in clock.summary()


@contextlib.contextmanager
def _startup_log(logger: str):
    """A _StartupLog on one of vLLM's loggers at INFO, as the engine attaches it, taken off afterwards."""
    handler, log = _StartupLog(), logging.getLogger(logger)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler, log
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def test_vllm_startup_parts_are_read_from_its_log_records():
    with _startup_log("vllm.v1.worker.gpu_model_runner") as (handler, log):
        log.info("Model loading took %s GiB memory and %.6f seconds", "0.25", 1.234567)
        log.info("Graph capturing finished in %.0f secs, took %.2f GiB", 7.6, 0.31)
        log.info("torch.compile and initial profiling/warmup run together took %.2f s in total", 20.5)
        log.info("some other message %s", 3.0)
    # full precision (not the '%.0f' of the text), one entry per part
    assert handler.seconds == {"engine_load": 1.234567, "engine_capture": 7.6, "engine_compile": 20.5}


def test_vllm_init_engine_less_its_timed_parts_is_the_warmup_and_the_plan_flag_is_read():
    with _startup_log("vllm.v1.engine.core") as (handler, log):
        log.info("Applying persisted startup plan (fingerprint %s): kv_cache_memory_bytes=%d", "abc", 5)
        log.info("torch.compile took %.2f s in total", 4.0)
        log.info("Initial profiling/warmup run took %.2f s", 1.5)
        log.info("Graph capturing finished in %.0f secs, took %.2f GiB", 2.0, 0.3)
        log.info("init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)", 12.0, 4.0)
    assert handler.plan_applied
    assert handler.parts() == {"engine_compile": 4.0, "engine_profile_run": 1.5, "engine_capture": 2.0,
                               "engine_warmup": pytest.approx(12.0 - 4.0 - 1.5 - 2.0)}
    # the worker's clock around the whole build (vllm's import included) is engine_init; the rest is engine_other
    parts = engine_parts(20.0, {"engine_import": 3.0, "engine_load": 1.0, **handler.parts(), "engine_init": 17.0,
                                "engine_other": 99.0, "engine_kv_from_plan": 1.0})
    assert parts["engine_init"] == 20.0 and parts["engine_kv_from_plan"] == 1.0
    assert parts["engine_other"] == pytest.approx(20.0 - 3.0 - 1.0 - 12.0)
    assert sum(parts[k] for k in ENGINE_PARTS) == pytest.approx(parts["engine_init"])
    # a torch engine reports nothing: all of it is engine_other
    assert engine_parts(0.5, {}) == {"engine_init": 0.5, "engine_other": 0.5}


class _Clock:
    """A fake perf_counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phase_table_has_every_row_of_the_issue_and_adds_up_to_the_total(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(startup.time, "perf_counter", fake)
    monkeypatch.setattr(startup, "process_age", lambda: 2.0)  # launch: 2 s
    clock = StartupClock()
    fake.now += 3.0
    clock.lap("ray_init")
    clock.parts["data_background"] = 4.0  # beside ray_init: listed, not summed
    fake.now += 1.0
    clock.lap("data")
    fake.now += 5.0
    clock.lap("workers")
    engine = engine_parts(30.0, {"engine_import": 4.0, "engine_load": 1.0, "engine_compile": 10.0,
                                 "engine_capture": 3.0, "engine_warmup": 6.0, "engine_kv_from_plan": 0.0})
    fake.now += 50.0  # the worker's init call
    clock.add_worker({"process_group": 1.0, "actor_build": 12.0, "actor_model_build": 7.0, "actor_weight_load": 4.5,
                      "ref_build": 2.0, "host_pin_wait": 0.5, **engine, "host_pin_background": 9.0, "first_sync": 1.5})
    fake.now += 8.0
    clock.lap("val_before_train")
    m = clock.done()
    total = m["timing_s/startup"]
    assert total == pytest.approx(2 + 3 + 1 + 5 + 50 + 8)
    table = phase_table(m, first_step=9.0)
    assert list(table) == ["ray", "workers", "model_build", "weight_load", "vllm_engine", "compile_and_capture",
                           "first_validation", "other", "to_first_step", "first_step"]
    assert table["ray"] == pytest.approx(3.0)
    # spawn 5 + process group 1 + the init call's own rest (50 - 1 - 12 - 2 - 0.5 - 30 - 1.5 = 3)
    assert table["workers"] == pytest.approx(5 + 1 + 3)
    assert table["model_build"] == pytest.approx(7.0 + 0.5 + 2.0)  # + the build's rest outside its two parts, + ref
    assert table["weight_load"] == 4.5
    assert table["vllm_engine"] == pytest.approx(4 + 1 + 6 + (30 - 4 - 1 - 10 - 3 - 6))
    assert table["compile_and_capture"] == 13.0
    assert table["first_validation"] == pytest.approx(8.0)
    assert table["other"] == pytest.approx(2 + 1 + 0.5 + 1.5)  # launch, data, host pin wait, first sync
    rows = sum(v for k, v in table.items() if k not in ("to_first_step", "first_step"))
    assert rows == pytest.approx(total, rel=1e-9)
    assert table["to_first_step"] == total and table["first_step"] == 9.0
    # the background and flag parts are reported but appear in no row
    assert m["timing_s/startup/host_pin_background"] == 9.0 and m["timing_s/startup/data_background"] == 4.0
    assert m["timing_s/startup/other"] == pytest.approx(0.0, abs=1e-9)
    assert "engine: import 4.0" in clock.summary()


def test_phase_table_of_a_run_without_inner_parts_puts_the_whole_build_and_engine_in_their_rows():
    m = {"timing_s/startup": 10.0, "timing_s/startup/launch": 1.0, "timing_s/startup/actor_build": 4.0,
         "timing_s/startup/engine_init": 3.0, "timing_s/startup/workers": 2.0}
    table = phase_table(m)
    assert table["model_build"] == 4.0 and table["weight_load"] == 0.0 and table["vllm_engine"] == 3.0
    assert table["other"] == 1.0 and "first_step" not in table


def test_kv_cache_sizing_plan_passes_the_plans_kv_bytes_and_the_others_leave_vllm_to_measure():
    from types import SimpleNamespace

    import torch

    from hybridrl.plan.estimate import estimate
    from hybridrl.plan.model_shape import from_hf_config
    from hybridrl.workers.common import planned_kv_cache_bytes

    hf = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
          "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
          "tie_word_embeddings": True}
    gpu = 80 * 2**30
    cuda = torch.device("cuda", 0)
    plan_run = _run("actor_rollout_ref.rollout.kv_cache_sizing=plan", "actor_rollout_ref.rollout.name=vllm",
                    "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    got = planned_kv_cache_bytes(plan_run, SimpleNamespace(to_dict=lambda: hf), cuda, gpu_memory_bytes=gpu)
    kv = estimate(plan_run, from_hf_config(hf), gpu).kv_cache
    assert got == kv.bytes and got > 0
    # the plan's rollout budget: gpu_memory_utilization of the GPU less the engine's weights and activations
    assert got < plan_run.cfg.actor_rollout_ref.rollout.gpu_memory_utilization * gpu
    for sizing in ("remember", "profile"):
        other = _run(f"actor_rollout_ref.rollout.kv_cache_sizing={sizing}", "actor_rollout_ref.rollout.name=vllm",
                     "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
        assert planned_kv_cache_bytes(other, hf, cuda, gpu_memory_bytes=gpu) is None
    assert planned_kv_cache_bytes(plan_run, hf, torch.device("cpu"), gpu_memory_bytes=gpu) is None
    with pytest.raises(Exception, match="kv_cache_sizing"):
        _run("actor_rollout_ref.rollout.kv_cache_sizing=guess")


def test_vllm_gets_the_kv_size_unless_the_user_set_one_and_remember_turns_on_vllms_startup_plan():
    from hybridrl.rollout.vllm_engine import llm_extra_kwargs, startup_env

    kw = llm_extra_kwargs(None, record_routing=False, moe=False, cudagraph_capture_sizes=None, kv_cache_bytes=123)
    assert kw["kv_cache_memory_bytes"] == 123
    user = llm_extra_kwargs({"kv_cache_memory_bytes": 7}, record_routing=False, moe=False,
                            cudagraph_capture_sizes=None, kv_cache_bytes=123)
    assert user["kv_cache_memory_bytes"] == 7
    assert "kv_cache_memory_bytes" not in llm_extra_kwargs(None, record_routing=False, moe=False,
                                                           cudagraph_capture_sizes=None)
    assert startup_env("remember") == {"VLLM_ENABLE_STARTUP_PLAN": "1"}
    assert startup_env("profile") == {} and startup_env("plan") == {}


def test_vllms_cache_root_is_fixed_and_outside_a_runs_temp_folder(monkeypatch, tmp_path):
    """The Ray workers' TMPDIR is a folder of the run, removed at its end: a compile cache there would be cold at
    every start. The root is the same for two runs and does not follow TMPDIR."""
    from hybridrl.rollout.vllm_engine import default_cache_root

    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("HYBRIDRL_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "run1"))
    first = default_cache_root()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "run2"))
    assert default_cache_root() == first == str(tmp_path / "models" / "vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/elsewhere")
    assert default_cache_root() == "/elsewhere"
