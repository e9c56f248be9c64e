"""Start-up: the parts a user waits for add up, and vLLM's CUDA graphs are fitted to the rollout batch."""
import logging
import time

import pytest

from hybridrl.config import load_config, validate
from hybridrl.rollout.vllm_engine import CAPTURE_GRID, _StartupLog, capture_sizes
from hybridrl.trainer.components import max_rollout_rows
from hybridrl.trainer.startup import StartupClock


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


def test_startup_clock_parts_add_up_to_the_total():
    clock = StartupClock()
    time.sleep(0.02)
    clock.lap("data")
    time.sleep(0.05)  # the worker's init call: 0.03 s its own parts, the rest its overhead
    clock.add_worker({"actor_build": 0.01, "engine_init": 0.02, "engine_compile": 0.015, "first_sync": 0.0,
                      "unrelated": 9.0})
    time.sleep(0.01)
    m = clock.done()
    parts = {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/startup/")}
    assert set(parts) == {"launch", "data", "actor_build", "engine_init", "engine_compile", "first_sync", "workers",
                          "other"}
    assert parts["data"] == pytest.approx(0.02, abs=0.015)
    assert parts["workers"] == pytest.approx(0.05 - 0.03, abs=0.015)  # init wall minus its listed parts
    assert parts["other"] == pytest.approx(0.01, abs=0.015)
    # engine_compile is inside engine_init: the total is the sum of the top-level parts only
    top = sum(v for k, v in parts.items() if k != "engine_compile")
    assert top == pytest.approx(m["timing_s/startup"], rel=1e-9)
    assert clock.done() == m  # later calls repeat the first
    assert clock.summary().startswith(f"hybridrl: start-up {m['timing_s/startup']:.1f} s")


def test_host_pinning_in_the_background_is_listed_but_only_its_wait_adds_up():
    """The actor pins its offload arenas on a thread (host_pin_background) while the start-up goes on; what the
    start-up waited for them (host_pin_wait) is a part of the worker's init like actor_build."""
    clock = StartupClock()
    time.sleep(0.04)
    clock.add_worker({"actor_build": 0.01, "host_pin_wait": 0.02, "host_pin_background": 5.0, "first_sync": 0.0})
    m = clock.done()
    parts = {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/startup/")}
    assert parts["host_pin_wait"] == 0.02 and parts["host_pin_background"] == 5.0
    assert parts["workers"] == pytest.approx(0.04 - 0.03, abs=0.015)
    top = sum(v for k, v in parts.items() if k != "host_pin_background")
    assert top == pytest.approx(m["timing_s/startup"], rel=1e-9)
    assert "host_pin_background" not in clock.summary()


def test_vllm_startup_parts_are_read_from_its_log_records():
    handler = _StartupLog()
    log = logging.getLogger("vllm.v1.worker.gpu_model_runner")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        log.info("Model loading took %s GiB memory and %.6f seconds", "0.25", 1.234567)
        log.info("Graph capturing finished in %.0f secs, took %.2f GiB", 7.6, 0.31)
        log.info("torch.compile and initial profiling/warmup run together took %.2f s in total", 20.5)
        log.info("some other message %s", 3.0)
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    # full precision (not the '%.0f' of the text), one entry per part
    assert handler.seconds == {"engine_load": 1.234567, "engine_capture": 7.6, "engine_compile": 20.5}
