"""SIGTERM to a torchrun SFT job (trainer.backend=local: 2 ranks, dp=2, megatron-core over gloo) ends it cleanly:
torchrun forwards the signal to both ranks, which agree on the step to stop at, save it, and rank 0 says so in one
line; the job ends within torchrun's shutdown timeout with status 143 and no traceback from the ranks or from the
launcher (`python -m hybridrl.torchrun`)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
import torch

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHUTDOWN_S = 90


def tiny_model_and_traces(tmp_path) -> tuple[str, str]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridrl.data.gen_tool_traces import generate, write_rows
    from hybridrl.data.tokenizer import build_tiny_tokenizer
    from hybridrl.trainer.demo import save_model

    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model_dir = str(tmp_path / "model")
    save_model(LlamaForCausalLM(config), tok, model_dir)
    rows, _ = generate("products", 16, 0, None)
    return model_dir, write_rows(rows, str(tmp_path / "data" / "train.parquet"))


@pytest.mark.timeout(240)
def test_sigterm_to_torchrun_saves_the_agreed_step_in_one_line(tmp_path):
    model_dir, train = tiny_model_and_traces(tmp_path)
    ckpt = tmp_path / "ckpt"
    # a shutdown timeout with room for a loaded 2-core machine: at torchrun's default 30 s the ranks' grace is 25 s,
    # and under other load their save once took longer (torchrun killed them at 30.8 s)
    cmd = [sys.executable, "-m", "hybridrl.torchrun", "--standalone", "--nproc_per_node=2",
           f"--shutdown-timeout={SHUTDOWN_S}", "-m",
           "hybridrl.trainer.main_sft", f"data.train_files={train}", f"model.path={model_dir}",
           "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2", "data.max_length=128",
           "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=10000",
           f"trainer.default_local_dir={ckpt}", "trainer.logger=[console]"]
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 150
        while not any(line.startswith("step 1 |") for line in seen):  # rank 0's console line of step 1
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen) + proc.stderr.read()
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen.append(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)  # to torchrun, as `docker stop` or a scheduler sends it
        start = time.monotonic()
        out, err = proc.communicate(timeout=SHUTDOWN_S + 30)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 128 + signal.SIGTERM, f"{out[-3000:]}\n{err[-3000:]}"
    print(f"ended {seconds:.1f} s after SIGTERM")
    assert seconds < SHUTDOWN_S - 5, seconds  # torchrun kills the ranks SHUTDOWN_S after forwarding: they ended first
    stopped = [line for line in out.splitlines() if line.startswith("hybridrl: stopped by SIGTERM after step ")]
    assert len(stopped) == 1, f"{out[-3000:]}\n{err[-3000:]}"  # rank 0 alone says it
    step = int(stopped[0].split("after step ")[1].split(";")[0])
    assert stopped[0].endswith(f"; saved it to {ckpt}/global_step_{step} (trainer.resume_mode=auto continues)")
    assert step >= 1 and (ckpt / f"global_step_{step}" / ".complete").is_file()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(step)
    # both ranks saved that step (each its shard and its random state): they stopped after the same one
    actor = ckpt / f"global_step_{step}" / "actor"
    assert sorted(p.name for p in (actor / "dist").glob("*.distcp")) == ["__0_0.distcp", "__0_1.distcp"]
    assert sorted(p.name for p in (actor / "rng").iterdir()) == ["rank_00000.safetensors", "rank_00001.safetensors"]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, f"{out[-3000:]}\n{err[-3000:]}"
