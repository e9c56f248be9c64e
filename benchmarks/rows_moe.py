"""Issue 38's rows of the run table (runs.py): a mixture of experts at speed, on one GPU and on four.

One lease, in this order (each row ends inside one device call; `runs.py show NAME` lists its commands):
  moe_te_tests        tests/gpu/test_megatron_moe_te.py (TE grouped-GEMM experts: names, export, log-probs, packed)
                      and tests/gpu/test_vllm_moe.py (the MoE sync into vLLM's fused experts, routing, R3)
  moe_1b_te_train     train_bench on the random Qwen3-MoE moe_1b, TE grouped GEMM, packed 16k-token micro-batches:
                      moe_mfu_active (active-parameter FLOPs over forward and backward)
  moe_1b_te_grpo      GRPO on moe_1b through the real trainer, TE, no offloads (the direct copy replays one CUDA graph):
                      moe_sync_over_floor, routing agreement, the gap
  moe_8b_ep4          four GPUs, the moe_8b shape (8.1B total, 64 experts, top-8; random init): ep4 training, vLLM
                      tp_g4 with its expert parallel (each rank's engine holds the experts its actor rank trains), router
                      replay off: moe_mfu_active_4gpu, moe_sync_over_floor_4gpu, routing agreement, plan vs measured peak
  moe_8b_ep4_r3       the same with R3 (the rollout's experts replayed): the R3 gap
  moe_8b_ep4_rtp4     (if time is left) vLLM with tensor-parallel experts: 3/4 of each rank's experts cross GPUs
  four_gpu_allgather_4  the NCCL and device-copy bandwidth on 4 GPUs (the floors of the 4-GPU syncs)
  moe_scale_report    benchmarks/moe_scale.py over OUT -> results/moe_scale.json + .md
Every trainer run writes OUT/NAME/ (run.json, plan.json: `hybridrl plan --json` for the same overrides on this GPU,
the trainer's logs/metrics.jsonl). CPU dry runs (`runs.py dry NAME`): the same steps on moe_tiny, gloo, the torch
engine and the local layer spec.
"""
from __future__ import annotations

import os

from rows_one_gpu import ARA, ENV, build_model, pytest
from runner import Actions, Capture, Command, Context, Fresh, Note, Run, Show, Step, WriteJson

MEG = f"{ARA}.actor.megatron"
EP, RTP, REP = f"{MEG}.expert_model_parallel_size", f"{ARA}.rollout.tensor_model_parallel_size", \
    f"{ARA}.rollout.expert_parallel_size"
KNOBS = {"MODEL_1B": "/tmp/qwen3_moe_1b", "MODELS": "/tmp", "STEPS": "5", "TIME_S": "240", "TOKENS": "8192",
         "GPU_UTIL": "0.3", "MOE_ARGS": ""}


class Layout:
    def __init__(self, what: str, gpus: int, overrides: tuple[str, ...], replay: str = "disabled") -> None:
        self.what, self.gpus, self.overrides, self.replay = what, gpus, overrides, replay


LAYOUTS = {
    "moe_1b_te_grpo": Layout("moe_1b on one GPU, TE grouped GEMM, no offloads", 1, (f"{RTP}=1",)),
    "moe_8b_ep4": Layout("moe_8b, ep4 training -> vLLM tp_g4 with expert parallel", 4,
                         (f"{EP}=4", f"{RTP}=4", f"{REP}=4")),
    "moe_8b_ep4_r3": Layout("moe_8b, ep4 -> vLLM tp_g4 expert parallel, router replay R3", 4,
                            (f"{EP}=4", f"{RTP}=4", f"{REP}=4"), replay="R3"),
    "moe_8b_ep4_rtp4": Layout("moe_8b, ep4 -> vLLM tp_g4 with tensor-parallel experts", 4, (f"{EP}=4", f"{RTP}=4")),
}


def model_for(c: Context, name: str) -> Actions:
    """The row's model folder, built when missing: moe_1b (with weights), moe_8b (config only: random init), or
    moe_tiny on CPU."""
    if c.cpu:
        folder, shape, more = os.path.join(c.knob("MODELS"), "m_moe_tiny"), "moe_tiny", ()
    elif name.startswith("moe_1b"):
        folder, shape, more = c.knob("MODEL_1B"), "moe_1b", ()
    else:
        folder, shape, more = os.path.join(c.knob("MODELS"), "m_moe_8b"), "moe_8b", ("--no-weights",)
    yield from build_model(c, f"model_{shape}", 120, folder, shape, *more)
    return folder


def grpo_overrides(c: Context, name: str, model: str, run: str) -> list[str]:
    """The GRPO job (the same for every layout of a shape): moe_1b 16 prompts x 8, moe_8b 64 x 8 (more tokens a GPU
    for the grouped GEMMs), 256 response tokens; routing recorded (agreement every step), padded micro-batches of at
    most TOKENS tokens (router replay maps the rollout's experts onto padded ones), no reference, no offloads."""
    lay = LAYOUTS[name]
    prompts, n, resp = (4, 4, 16) if c.cpu else (16 if lay.gpus == 1 else 64, 8, 256)
    device = ([f"{ARA}.rollout.name=torch", "trainer.device=cpu", f"{MEG}.transformer_impl=local"] if c.cpu
              else [f"{ARA}.rollout.name=vllm", "trainer.device=cuda", f"{MEG}.transformer_impl=transformer_engine"])
    random_init = [] if c.cpu or name.startswith("moe_1b") else [f"{ARA}.actor.load_weight=false"]
    return ["--config-name", "grpo_trainer", f"{ARA}.model.path={model}", f"data.train_files={model}/data/train.parquet",
            f"data.val_files={model}/data/test.parquet", "data.max_prompt_length=64", f"data.max_response_length={resp}",
            f"data.train_batch_size={prompts}", f"{ARA}.actor.ppo_mini_batch_size={prompts}", f"{ARA}.rollout.n={n}",
            f"{ARA}.rollout.ignore_eos=true", f"{ARA}.actor.use_dynamic_bsz=true",
            f"{ARA}.actor.ppo_max_token_len_per_gpu={c.knob('TOKENS')}", f"{ARA}.actor.use_kl_loss=false",
            f"{ARA}.rollout.enable_rollout_routing_replay=true", f"{ARA}.actor.router_replay.mode={lay.replay}",
            f"{ARA}.rollout.gpu_memory_utilization={c.knob('GPU_UTIL')}", *device, *random_init,
            f"trainer.n_gpus_per_node={lay.gpus}", f"trainer.total_training_steps={3 if c.cpu else c.knob('STEPS')}",
            f"trainer.max_time_s={c.knob('TIME_S')}", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[console,jsonl]", "trainer.progress_bar=false",
            f"trainer.default_local_dir={run}", *lay.overrides, *c.words("MOE_ARGS")]


def device_info(c: Context) -> Actions:
    """(device name, GiB of the first GPU as the plan should see it, its device-copy bytes/s: the sync's floor)."""
    if c.cpu:
        return "cpu", "80", None
    query = ("import sys, torch; sys.path.insert(0, 'benchmarks'); from bench_common import d2d_bandwidth; "
             "print(torch.cuda.get_device_name(), f'{torch.cuda.mem_get_info()[1] / 2**30:.1f}', "
             "f'{d2d_bandwidth():.6g}', sep='|')")
    device, gib, d2d = (yield Capture((c.python, "-c", query), placeholder="GPU|80.0|1.5e12")).split("|")
    return device, gib, float(d2d)


def grpo(name: str):
    """One trainer run of LAYOUTS[name] into OUT/NAME: its plan, run.json, the trainer for what the call has left."""
    def steps(c: Context) -> Actions:
        model = yield from model_for(c, name)
        run = c.path(name)
        yield Fresh(run)
        overrides = grpo_overrides(c, name, model, run)
        device, gib, d2d = yield from device_info(c)
        rc = yield Command((c.python, "-m", "hybridrl", "plan", *overrides, "--json", "--gpu-mem-gb", gib),
                           stdout=os.path.join(run, "plan.json"), stderr=os.path.join(run, "plan.err"))
        yield Show((os.path.join(run, "plan.err"),), exclude="warn", tail=3, prefix=f"plan rc={rc} ({gib} GiB): ")
        lay = LAYOUTS[name]
        cmd = (c.python, "-m", "hybridrl.trainer.main_ppo", *overrides)
        yield WriteJson(os.path.join(run, "run.json"), {
            "name": name, "shape": name, "model_shape": os.path.basename(model).removeprefix("m_"), "what": lay.what,
            "gpus": lay.gpus, "device": device, "gpu_memory_gib": float(gib), "d2d_bytes_per_s": d2d, "model_dir": model,
            "router_replay": lay.replay, "layout_overrides": list(lay.overrides),
            "extra_overrides": c.words("MOE_ARGS"), "command": " ".join(cmd)})
        left = max(60, 570 - int(c.elapsed()))
        yield Note(f"{name}: {lay.what}; trainer for at most {left}s; progress: tail -f {run}.log")
        yield Step(name, left, cmd)
        yield Show((f"{run}.log",), r"start-up|max_time_s|rollout_vs_actor/|perf/mfu|reshard_stream|Error|error:",
                   tail=8)
    return steps


def train(c: Context) -> Actions:
    """train_bench on moe_1b: TE grouped GEMM (on CPU: the local spec, moe_tiny, no timings), packed micro-batches of
    16k tokens, GSM8K-like lengths, 256 samples an update (about 140k tokens)."""
    model = yield from model_for(c, "moe_1b")
    bench = (c.python, "benchmarks/train_bench.py", "--model-dir", model, "--packed", "--lengths", "gsm8k",
             "--skip-offload", "--dynamic-tokens", "512" if c.cpu else "16384", "--samples", "256",
             "--out", c.path("moe_1b_te_train.json"))
    impl = ("--transformer-impl", "local", "--cpu-dry-run") if c.cpu else ("--transformer-impl", "transformer_engine")
    yield Step("moe_1b_te_train", 240, (*bench, *impl, *c.words("MOE_ARGS")))
    yield Show((c.path("moe_1b_te_train.log"),), r"moe_mfu_active|train_mfu_forward_backward|experts|peak_memory")


def tests(c: Context) -> Actions:
    yield pytest(c, "test_megatron_moe_te", 300, "-s")
    yield Show((c.path("test_megatron_moe_te.log"),), r"^\[moe te|passed|failed")
    yield pytest(c, "test_vllm_moe", 280, "-s")
    yield Show((c.path("test_vllm_moe.log"),), r"^\[moe gpu\]|passed|failed")


def report(c: Context) -> Actions:
    yield Command((c.python, "benchmarks/moe_scale.py", "report", "--in-dir", c.out, "--out",
                   c.path("results", "moe_scale.json"), "--command",
                   "OUT=$OUT python3 benchmarks/runs.py run NAME for NAME in moe_te_tests moe_1b_te_train moe_1b_te_grpo "
                   "moe_8b_ep4 moe_8b_ep4_r3 [moe_8b_ep4_rtp4] four_gpu_allgather_4 moe_scale_report"), tail=40)


def row(name: str, what: str, steps, gpus: int = 1, cpu: bool = True, **kw) -> Run:
    return Run(name, f"issue 38: {what}", steps, gpus=gpus, knobs=KNOBS, cpu=cpu, env=ENV, results=("moe_scale.json",),
               **kw)


ROWS = [
    row("moe_te_tests", "tests/gpu MoE on TE grouped GEMM, then the MoE sync into vLLM (test_vllm_moe)", tests,
        cpu=False),
    row("moe_1b_te_train", "train_bench on moe_1b with TE grouped GEMM: moe_mfu_active", train),
    *[row(name, f"GRPO, {lay.what}", grpo(name), gpus=lay.gpus) for name, lay in LAYOUTS.items()],
    row("moe_scale_report", "moe_scale.py over OUT -> results/moe_scale.json + .md", report, gpus=0),
]
