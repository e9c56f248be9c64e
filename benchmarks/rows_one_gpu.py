"""The one-GPU rows of the run table (runs.py): tests/gpu, the rollout, gap, GRPO, agent, speed, MoE, scale and LoRA runs.
Each function yields the steps of one row (runner.py); logs go under OUT, results under OUT/results. Every vLLM
engine runs with CUDA graphs (vLLM's default) unless a row says eager. The order of one lease's calls and what each
measured are in the results files (benchmarks/results/*.md), not here.
"""
from __future__ import annotations

import os

from lora_bench import VARIANTS_7B, VARIANTS_SMOL
from runner import ROOT, Actions, Capture, Command, Context, Fresh, Note, Run, Show, Step, WriteJson

ARA = "actor_rollout_ref"
SMOL = "/tmp/smol"  # SmolLM2-135M-Instruct's GGUF, joined there by `gpu_run.sh stage`
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_CACHE = "/tmp/mcache"
ENV = {"PYTHONPATH": f"{ROOT}:/tmp/site",
       "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "HYBRIDRL_MODEL_CACHE": MODEL_CACHE, "TOKENIZERS_PARALLELISM": "false"}


def pytest(c: Context, name: str, cap_s: int, *more: str) -> Step:
    return Step(name, cap_s, (c.python, "-m", "pytest", "-q", "-x", *more, f"tests/gpu/{name}.py"))


def smol_dir(c: Context, env: dict[str, str] | None = None) -> Capture:
    """The dequantized SmolLM2 HF folder of SMOL's GGUF (made once; the first call also prints a progress line)."""
    code = f"from hybridrl.utils.hf_model import materialize_hf_dir as m; print(m('{SMOL}', '{GGUF}'))"
    return Capture((c.python, "-c", code), placeholder=f"{MODEL_CACHE}/SmolLM2-135M-Instruct.Q4_1-KEY", env=env or {})


def build_model(c: Context, name: str, cap_s: int, folder: str, shape: str, *more: str) -> Actions:
    """multi_gpu_bench's random model (weights + the demo's arithmetic data) in `folder`, unless it is there."""
    if not os.path.exists(os.path.join(folder, "config.json")):
        yield Step(name, cap_s, (c.python, "benchmarks/multi_gpu_bench.py", "model", "--dir", folder, "--shape", shape,
                                 *more))


# ------------------------------------------------------------------------------------------------ tests, rollout
def checks(c: Context) -> Actions:
    yield Step("test_controller_gpu", 150, (c.python, "-m", "pytest", "-q", "-x", "tests/gpu/test_controller_gpu.py"))
    yield pytest(c, "test_megatron_gpu", 200, "-s")
    yield pytest(c, "test_vllm_hybrid", 200, "-s")
    bench = (c.python, "benchmarks/train_bench.py")
    yield Step("train_bench_local", 150, (*bench, "--attention-backend", "local", "--out", c.path("train_bench_local.json")))
    yield Step("train_bench", 150, (*bench, "--peer", c.path("train_bench_local.json"),
                                    "--out", c.path("results", "train_bench.json")))


def bench(c: Context) -> Actions:
    yield Step("hybrid_bench", 570, (c.python, "benchmarks/hybrid_bench.py", "--out-dir", c.path("results")))
    yield Show((c.path("hybrid_bench.log"),), r"^(rep |peer |gap |follow )")


def gap(c: Context) -> Actions:
    model = c.knob("MODEL")
    yield from build_model(c, "model", 200, model, "1.5b")
    yield from gap_bench(c, "gap_bench", 280, model)
    yield from gap_bench(c, "gap_bench_smollm2", 240, (yield smol_dir(c)))


def gap_bench(c: Context, name: str, cap_s: int, model: str) -> Actions:
    yield Step(name, cap_s, (c.python, "benchmarks/gap_bench.py", "--model-dir", model,
                             "--out", c.path("results", f"{name}.json")))
    yield Show((c.path(f"{name}.log"),), "_vs_")


def grpo(c: Context) -> Actions:
    name = c.knob("GRPO_NAME")
    cmd = (c.python, "-m", "hybridrl.trainer.main_ppo", "--config-name", "grpo_smollm2_gsm8k", f"{ARA}.model.path={SMOL}",
           f"trainer.default_local_dir={c.path('grpo_' + name)}", f"trainer.max_time_s={c.knob('GRPO_TIME_S')}",
           *c.words("GRPO_ARGS"))
    yield Step(f"grpo_{name}", 590, cmd)
    yield Show((c.path(f"grpo_{name}.log"),), "start-up")
    report = c.path(f"grpo_report_{name}.log")
    yield Command((c.python, "benchmarks/grpo_report.py", "--metrics", c.path(f"grpo_{name}", "logs", "metrics.jsonl"),
                   "--command", " ".join(cmd), "--out", c.path("results", f"grpo_{name}.json")), stdout=report)
    yield Show((report,), tail=40)


def agent(c: Context) -> Actions:
    yield pytest(c, "test_agent_vllm", 200, "-s")
    folder = yield smol_dir(c)
    yield Step("agent_bench", 240, (c.python, "benchmarks/agent_bench.py", "--model-dir", folder,
                                    "--out", c.path("results", "agent_loop.json")))


def agentgrpo(c: Context) -> Actions:
    yield Step("agent_grpo", 280, (c.python, "-m", "hybridrl.trainer.main_ppo", "--config-name", "agent_smollm2_calc",
                                   f"{ARA}.model.path={SMOL}", f"trainer.default_local_dir={c.path('agent_grpo')}",
                                   f"trainer.max_time_s={c.knob('AGENT_TIME_S')}", *c.words("AGENT_ARGS")))
    yield Show((c.path("agent_grpo.log"),), r"agent/|val/score", tail=12)


def report(c: Context) -> Actions:
    """rollout_graphs_report over the grpo runs named graphs, warm and eager and the gap runs of the same OUT."""
    runs = [a for name in ("graphs", "warm", "eager") for a in (f"--{name}", c.path(f"grpo_{name}/logs/metrics.jsonl"))]
    yield Command((c.python, "benchmarks/rollout_graphs_report.py", "--bench", c.path("results"), *runs,
                   "--gap", f"1.5b_random={c.path('results', 'gap_bench.json')}",
                   "--gap", f"smollm2_135m={c.path('results', 'gap_bench_smollm2.json')}",
                   "--out", c.path("results", "rollout_graphs.json")))


def te(c: Context) -> Actions:
    """transformer-engine's GPU tests (with TE installed its layer spec is the default)."""
    yield pytest(c, "test_megatron_te", 400, "-s")
    yield pytest(c, "test_megatron_gpu", 180, "-s")
    yield Show((c.path("test_megatron_*.log"),), r"^\[te|^\[fp8|^\[megatron gpu\]")


# ------------------------------------------------------------------------------------------------ speed (issue 19)
def speed(c: Context) -> Actions:
    """train_bench on SHAPE with a GSM8K-like length spread: local vs TE, padded vs packed, then each FP8 recipe."""
    shape = c.knob("SHAPE")
    model = f"/tmp/m_{shape}"
    yield from build_model(c, "model", 240, model, shape)
    common = (c.python, "benchmarks/train_bench.py", "--model-dir", model, "--shape", shape, "--lengths", "gsm8k",
              "--samples", c.knob("SAMPLES"), "--micro", c.knob("MICRO"), "--skip-offload", *c.words("SPEED_ARGS"))
    local = c.path(f"speed_{shape}_local.json")  # the base of the ratio, not a result of its own
    te_, packed = c.path("results", f"speed_{shape}_te.json"), c.path("results", f"speed_{shape}_te_packed.json")
    yield Step("speed_local", 150, (*common, "--transformer-impl", "local", "--out", local))
    yield Step("speed_te", 150, (*common, "--transformer-impl", "transformer_engine", "--peer", local, "--out", te_))
    # the profile's rows come after the result is written: it does not touch the metrics
    yield Step("speed_te_packed", 150, (*common, "--transformer-impl", "transformer_engine", "--packed",
                                        "--profile", c.knob("PROFILE"), "--peer", te_, "--out", packed))
    for recipe in c.words("FP8_RECIPES"):  # the packed TE run again with each scaling recipe, against bf16 packed
        yield Step(f"speed_te_packed_fp8_{recipe}", 150, (
            *common, "--transformer-impl", "transformer_engine", "--packed", "--fp8", "e4m3", "--fp8-recipe", recipe,
            "--peer", packed, "--out", c.path("results", f"speed_{shape}_te_packed_fp8_{recipe}.json")))
    yield Show((c.path("results", f"speed_{shape}_*.json"),), r"_vs_|train_mfu")


def speed7b(c: Context) -> Actions:
    """The 7B shape's fastest fit (8192-token micro-batches, nothing recomputed, the optimizer state back from the
    host for its step only, as in the hybrid engine), then the scale row's memory knobs (every layer recomputed)."""
    model = yield from scale_model(c, "7b")  # config only: random init
    common = (c.python, "benchmarks/train_bench.py", "--model-dir", model, "--shape", "7b", "--lengths", "gsm8k",
              "--random-init", "--transformer-impl", "transformer_engine", "--packed", "--samples", c.knob("SAMPLES"),
              "--skip-offload", "--offload-optimizer", "--updates", c.knob("UPDATES"))
    yield Step("speed_7b", 300, (*common, "--dynamic-tokens", c.knob("TOKENS"), "--profile", c.knob("PROFILE"),
                                 *c.words("SPEED_ARGS"), "--out", c.path("results", "speed_7b.json")))
    if c.knob("RECOMPUTE_RUN") == "1":  # MFU counts 6*N*tokens, so recompute costs it ~25%
        yield Step("speed_7b_recompute", 240, (*common, "--recompute", "--dynamic-tokens", "16384", *c.words("SPEED_ARGS"),
                                               "--out", c.path("results", "speed_7b_recompute.json")))
    yield Show((c.path("results", "speed_7b*.json"),), r"train_mfu|peak_memory")


def speed7bcmp(c: Context) -> Actions:
    """The 7B shape's two ratios: local vs TE (both padded), then packed vs padded (both TE); every run recomputes
    layers and cuts micro-batches at TOKENS (the padded ones grow to ~1.7x that with padding)."""
    model = yield from scale_model(c, "7b")
    common = (c.python, "benchmarks/train_bench.py", "--model-dir", model, "--shape", "7b", "--lengths", "gsm8k",
              "--random-init", "--samples", c.knob("SAMPLES"), "--skip-offload", "--offload-optimizer",
              "--updates", c.knob("UPDATES"), "--recompute", "--dynamic-tokens", c.knob("TOKENS"), *c.words("SPEED_ARGS"))
    out = {k: c.path("results", f"speed_7b_{k}.json") for k in ("local", "te", "te_packed")}
    yield Step("speed_7b_local", 240, (*common, "--transformer-impl", "local", "--out", out["local"]))
    yield Step("speed_7b_te", 200, (*common, "--transformer-impl", "transformer_engine", "--peer", out["local"],
                                    "--out", out["te"]))
    yield Step("speed_7b_te_packed", 200, (*common, "--transformer-impl", "transformer_engine", "--packed",
                                           "--peer", out["te"], "--out", out["te_packed"]))
    yield Show(tuple(out.values()), r"_vs_|train_mfu|peak_memory")


def update7b(c: Context) -> Actions:
    """Issue 39's whole 7B update split (update_split.py; benchmarks/results/startup.md says what each run decides):
    the serial onload at 4096- and 8192-token micro-batches, the overlap at the plan's reserve, with a larger reserve,
    and with a log-prob pass before each update (the trainer's warm allocator)."""
    model = yield from scale_model(c, "7b")
    common = (c.python, "benchmarks/train_bench.py", "--model-dir", model, "--shape", "7b", "--lengths", "gsm8k",
              "--random-init", "--transformer-impl", "transformer_engine", "--packed", "--skip-offload",
              "--offload-optimizer", "--samples", c.knob("SAMPLES"), "--updates", c.knob("UPDATES"))
    runs = {"serial_4096": ("--onload-overlap", "off", "--dynamic-tokens", "4096"),
            "serial_8192": ("--onload-overlap", "off", "--dynamic-tokens", "8192"),
            "plan_4096": ("--onload-overlap", "plan", "--dynamic-tokens", "4096"),
            "roomy_4096": ("--onload-overlap", "plan", "--onload-reserve-gb", c.knob("ROOMY_GB"), "--dynamic-tokens",
                           "4096"),
            "warm_4096": ("--onload-overlap", "plan", "--logprob-between", "--dynamic-tokens", "4096")}
    for name in c.words("UPDATE_RUNS"):
        yield Step(f"update_{name}", 150, (*common, *runs[name], "--out", c.path("results", f"update_{name}.json")))
    yield Show((c.path("results", "update_*.md"),), r"whole update|caching allocator|of the update|optimizer state")


SPEED_KNOBS = {"SAMPLES": "64", "SPEED_ARGS": "", "PROFILE": "20", "UPDATES": "3", "TOKENS": "8192",
               "SCALE_MODELS": "/tmp"}


# ------------------------------------------------------------------------------------------------ MoE (issue 20)
def moe(c: Context) -> Actions:
    """The random Qwen3-MoE moe_1b + arithmetic data: GRPO with routing recorded (router replay off, then R3),
    gap_bench on the same model, moe_report.py."""
    model, steps = c.knob("MODEL"), c.knob("MOE_STEPS")
    yield from build_model(c, "moe_model", 50, model, "moe_1b")
    job = ("--config-name", "grpo_trainer", "preset=0.5b_1gpu", f"{ARA}.model.path={model}",
           f"data.train_files={model}/data/train.parquet", f"data.val_files={model}/data/test.parquet",
           "data.max_prompt_length=64", "data.max_response_length=256", "data.train_batch_size=16",
           f"{ARA}.actor.ppo_mini_batch_size=16", f"{ARA}.actor.ppo_micro_batch_size_per_gpu=8",
           f"{ARA}.rollout.log_prob_micro_batch_size_per_gpu=16", f"{ARA}.rollout.n=8", f"{ARA}.actor.use_kl_loss=false",
           f"{ARA}.rollout.ignore_eos=true", f"{ARA}.rollout.gpu_memory_utilization=0.4", f"{ARA}.rollout.name=vllm",
           "trainer.device=cuda", f"{ARA}.rollout.enable_rollout_routing_replay=true",
           f"trainer.total_training_steps={steps}", "trainer.max_time_s=60", "trainer.test_freq=-1",
           "trainer.save_freq=-1", "trainer.val_before_train=false", "trainer.logger=[console,jsonl]",
           "trainer.progress_bar=false", *c.words("MOE_ARGS"))
    yield Note(f"moe: model {model}, {steps} steps a run; progress: tail -f {c.path('moe_*.log')}")
    for name, mode, cap_s in (("noreplay", "disabled", 225), ("r3", "R3", 150)):
        yield Step(f"moe_grpo_{name}", cap_s, (c.python, "-m", "hybridrl.trainer.main_ppo", *job,
                                               f"{ARA}.actor.router_replay.mode={mode}",
                                               f"trainer.default_local_dir={c.path('moe_' + name)}"))
        yield Show((c.path(f"moe_grpo_{name}.log"),), r"start-up|max_time_s|rollout_vs_actor/|perf/mfu|reshard_stream",
                   tail=8)
    # the trainer runs' engine settings (max_model_len, capture sizes for 16 x 8 rows, routing recorded), so vLLM's
    # compile cache from the runs above applies
    yield Step("moe_gap", 115, (c.python, "benchmarks/gap_bench.py", "--model-dir", model, "--prompts", "32",
                                "--max-tokens", "256", "--rollout-rows", "128",
                                "--override", f"{ARA}.rollout.enable_rollout_routing_replay=true",
                                "--override", f"{ARA}.rollout.gpu_memory_utilization=0.4", "--out", c.path("moe_gap.json")))
    yield Show((c.path("moe_gap.log"),), "_vs_")
    yield Step("moe_report", 25, (c.python, "benchmarks/moe_report.py", "--noreplay",
                                  c.path("moe_noreplay/logs/metrics.jsonl"), "--r3", c.path("moe_r3/logs/metrics.jsonl"),
                                  "--gap", c.path("moe_gap.json"), "--model-dir", model,
                                  "--command", f"OUT=$OUT python3 benchmarks/runs.py run moe  # trainer: {' '.join(job)}",
                                  "--out", c.path("results", "moe_grpo.json")))
    yield Show((c.path("results", "moe_grpo.md"),))


# ------------------------------------------------------------------------------------------------ scale (issue 19)
# The scale curve's per-shape trainer overrides on one H200 (139.8 GiB as torch counts it): memory knobs only,
# checked with `hybridrl plan` (its numbers for each row are in the run folder's plan.json). All rows pack sequences
# and cut micro-batches by tokens (scale_common); the budget shrinks with the model's state. 7b: 7.6B params x
# (2 bf16 params + 4 fp32 grads + 12 Adam/fp32 master) = 137 GB is only on the GPU for the optimizer step: with
# optimizer_offload=true the hybrid engine keeps the optimizer state on the host from the rollout until the update's
# first optimizer step (weight_sync.py), so the log-prob passes and the forward/backward run without it; layers are
# recomputed. The grads stay in fp32: with bf16 grads the distributed optimizer copies them to fp32 for the step
# (adam_mem.md). The reference is off (use_kl_loss=false) for the host's sake (megatron_scale.md). What an 80 GB
# card (H100) needs on top, as SCALE_ARGS: megatron_scale_h100.md.
SCALE_SHAPES = {
    "0.5b": (f"{ARA}.actor.ppo_max_token_len_per_gpu=16384",),
    "1.5b": (f"{ARA}.actor.ppo_max_token_len_per_gpu=8192",),
    "3b": (f"{ARA}.actor.ppo_max_token_len_per_gpu=8192",),
    "7b": (f"{ARA}.actor.ppo_max_token_len_per_gpu=4096", f"{ARA}.model.enable_gradient_checkpointing=true",
           f"{ARA}.actor.use_kl_loss=false", f"{ARA}.actor.load_weight=false", f"{ARA}.actor.megatron.optimizer_offload=true"),
}
SCALE_KNOBS = {"STEPS": "", "SCALE_TIME_S": "150", "SCALE_BUDGET_S": "570", "SCALE_ROW": "", "SCALE_ARGS": "",
               "SCALE_MODELS": "/tmp"}


def scale_model(c: Context, shape: str) -> Actions:
    """SCALE_MODELS/m_SHAPE (the tiny model on CPU), built when missing; gives its path. The 7b one starts from random
    weights in megatron and placeholders in vLLM (its row's load_weight=false): no 15 GB file."""
    shape = "tiny" if c.cpu else shape
    folder = os.path.join(c.knob("SCALE_MODELS"), f"m_{shape}")
    yield from build_model(c, f"model_{shape}", 300, folder, shape, *(["--no-weights"] if shape == "7b" else []))
    return folder


def scale_common(c: Context, model: str, run: str) -> list[str]:
    """The workload, the same for every shape (on CPU: 4 prompts x 4 samples of 16 tokens, 3 steps, torch engine)."""
    prompts, n, resp = (4, 4, 16) if c.cpu else (16, 8, 256)
    device = ([f"{ARA}.rollout.name=torch", "trainer.device=cpu"] if c.cpu
              else [f"{ARA}.rollout.name=vllm", "trainer.device=cuda"])
    return ["--config-name", "grpo_trainer", f"{ARA}.model.path={model}", f"data.train_files={model}/data/train.parquet",
            f"data.val_files={model}/data/test.parquet", "data.max_prompt_length=64", f"data.max_response_length={resp}",
            f"data.train_batch_size={prompts}", f"{ARA}.actor.ppo_mini_batch_size={prompts}", f"{ARA}.rollout.n={n}",
            f"{ARA}.rollout.ignore_eos=true", f"{ARA}.model.use_remove_padding=true", f"{ARA}.actor.use_dynamic_bsz=true",
            f"{ARA}.rollout.gpu_memory_utilization=0.4", f"{ARA}.rollout.tensor_model_parallel_size=1",
            "trainer.n_gpus_per_node=1", *device, f"trainer.total_training_steps={c.knob('STEPS') or (3 if c.cpu else 4)}",
            f"trainer.max_time_s={c.knob('SCALE_TIME_S')}", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[console,jsonl]", "trainer.progress_bar=false",
            f"trainer.default_local_dir={run}"]


def scale(shape: str):
    """Issue 19's scale curve, one shape a call: `hybridrl plan --json` for the exact trainer overrides, GRPO through
    the real trainer on one GPU for STEPS steps (trainer.max_time_s=SCALE_TIME_S as a guard; the whole call stops at
    SCALE_BUDGET_S), then scale_report.py over every OUT/scale_* so far -> results/megatron_scale.json + .md."""
    def steps(c: Context) -> Actions:
        row = c.words("SCALE_ROW") or list(SCALE_SHAPES[shape])
        model = yield from scale_model(c, shape)
        run = c.path(f"scale_{shape}")
        yield Fresh(run)
        overrides = scale_common(c, model, run) + row + c.words("SCALE_ARGS")
        if c.cpu:
            device, gib = "cpu", "80"
        else:
            query = "import torch; print(torch.cuda.get_device_name(), '|', f'{torch.cuda.mem_get_info()[1] / 2**30:.1f}', sep='')"
            device, gib = (yield Capture((c.python, "-c", query), placeholder="GPU|80.0")).split("|")
        rc = yield Command((c.python, "-m", "hybridrl", "plan", *overrides, "--json", "--gpu-mem-gb", gib),
                           stdout=os.path.join(run, "plan.json"), stderr=os.path.join(run, "plan.err"))
        yield Show((os.path.join(run, "plan.err"),), exclude="warn", tail=2, prefix=f"plan rc={rc} ({gib} GiB): ")
        cmd = (c.python, "-m", "hybridrl.trainer.main_ppo", *overrides)
        yield WriteJson(os.path.join(run, "run.json"), {
            "shape": shape, "model_shape": os.path.basename(model).removeprefix("m_"), "device": device,
            "gpu_memory_gib": float(gib), "model_dir": model, "shape_overrides": row,
            "extra_overrides": c.words("SCALE_ARGS"), "command": " ".join(cmd)})
        left = max(60, int(c.knob("SCALE_BUDGET_S")) - int(c.elapsed()) - 20)  # less the report's share
        yield Note(f"scale {shape}: model {model}, trainer for at most {left}s; progress: tail -f {run}.log")
        yield Step(f"scale_{shape}", left, cmd)
        yield Show((f"{run}.log",), r"start-up|max_time_s|Error|error:", tail=4)
        how = "dry" if c.cpu else "run"
        yield Step("scale_report", 20, (c.python, "benchmarks/scale_report.py", "--in-dir", c.out, "--out",
                                        c.path("results", "megatron_scale.json"), "--command",
                                        f"OUT=$OUT python3 benchmarks/runs.py {how} scale_SHAPE  # each run's trainer "
                                        "command: runs.SHAPE.command"), tail=0)
        yield Show((c.path("results", "megatron_scale.md"),))
    return steps


def scalemodel(c: Context) -> Actions:
    """Only build SCALE_MODELS/m_SHAPE for each shape given (e.g. 7b beside the staging, to keep scale_7b short)."""
    for shape in c.args:
        yield Note((yield from scale_model(c, shape)))


def moetest(c: Context) -> Actions:
    yield pytest(c, "test_vllm_moe", 420, "-s")
    yield Show((c.path("test_vllm_moe.log"),), r"^\[moe gpu\]")


def gpu_test(name: str):
    def steps(c: Context) -> Actions:
        yield pytest(c, name, 570, "-s")
    return steps


# ------------------------------------------------------------------------------------------------ LoRA (issue 40)
LORA_KNOBS = {"STEPS": "", "SCALE_TIME_S": "150", "SCALE_MODELS": "/tmp", "GPU_UTIL": "0.3", "GRPO_TIME_S": "420",
              "LORA_ARGS": ""}


def lora_7b(variant: str):
    """Issue 40: the scale curve's 7B workload on one GPU (random weights: SCALE_MODELS/m_7b, built with --no-weights
    when missing), full fine-tuning with the scale row's overrides or LoRA (lora_bench.VARIANTS_7B), vLLM at GPU_UTIL
    of the GPU for every variant alike. Full fine-tuning's 7B peak is 131 GiB (megatron_scale.md): an H200 row."""
    def steps(c: Context) -> Actions:
        model = yield from scale_model(c, "7b")
        run = c.path(f"lora_7b_{variant}")
        yield Fresh(run)
        overrides = [*scale_common(c, model, run), *SCALE_SHAPES["7b"],
                     f"{ARA}.rollout.gpu_memory_utilization={c.knob('GPU_UTIL')}", *VARIANTS_7B[variant],
                     *c.words("LORA_ARGS")]
        yield Step(f"lora_7b_{variant}", 560, (c.python, "-m", "hybridrl.trainer.main_ppo", *overrides))
        yield Show((f"{run}.log",), r"start-up|vLLM LoRA|lora_base_resident|Error|error:", tail=4)
    return steps


def lora_smol(variant: str):
    """Issue 40: GRPO on SmolLM2 + gsm_symbolic for GRPO_TIME_S (the grpo row's job), with LoRA or full fine-tuning
    (lora_bench.VARIANTS_SMOL); on CPU the demo's tiny model for 2 steps with validation before and after."""
    def steps(c: Context) -> Actions:
        run = c.path(f"lora_{variant}")
        yield Fresh(run)
        if c.cpu:
            cmd = (c.python, "-m", "hybridrl.trainer.demo", "--out", run, "--sft-steps", "5",
                   "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=-1",
                   "trainer.val_before_train=true", *VARIANTS_SMOL[variant], *c.words("LORA_ARGS"))
        else:
            cmd = (c.python, "-m", "hybridrl.trainer.main_ppo", "--config-name", "grpo_smollm2_gsm8k",
                   f"{ARA}.model.path={SMOL}", f"trainer.default_local_dir={run}",
                   f"trainer.max_time_s={c.knob('GRPO_TIME_S')}", *VARIANTS_SMOL[variant], *c.words("LORA_ARGS"))
        yield Step(f"lora_{variant}", 590, cmd)
        yield Show((f"{run}.log",), r"start-up|vLLM LoRA|val/score|Error|error:", tail=4)
    return steps


def lora_report(c: Context) -> Actions:
    """lora_bench.py's report over the lora_* runs of OUT -> results/lora.json + .md."""
    query = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
    device = yield Capture((c.python, "-c", query), placeholder="GPU")
    yield Command((c.python, "benchmarks/lora_bench.py", "report", "--in-dir", c.out, "--out",
                   c.path("results", "lora.json"), "--device", device))
    yield Show((c.path("results", "lora.md"),))


# ------------------------------------------------------------------------------------------------ start-up (issue 39)
def startup_report(c: Context) -> Command:
    return Command((c.python, "benchmarks/startup_bench.py", "report", "--in-dir", c.out,
                    "--out", c.path("results", "startup.json"), *(("--cpu",) if c.cpu else ())))


def startup_smol(c: Context) -> Actions:
    """The SmolLM2 job twice back to back (startup_bench.py smol: cold caches, then warm), then the report."""
    yield Command((c.python, "benchmarks/startup_bench.py", "smol", "--out", c.out, "--model", SMOL,
                   *(("--cpu",) if c.cpu else ())))
    yield startup_report(c)


def startup_7b(c: Context) -> Actions:
    """four_gpu.py's 7b_big_1gpu for two steps (tag startup), then the report over the same OUT (with startup_smol's
    runs where they are there). MODELS: where four_gpu.py finds or builds its random model (m_SHAPE)."""
    name = "tiny_1" if c.cpu else "7b_big_1gpu"
    yield Command((c.python, "benchmarks/four_gpu.py", "run", name, "--steps", "2", "--tag", "startup", "--out", c.out,
                   "--models", c.knob("MODELS"), "--budget", "540", "--override", "actor_rollout_ref.rollout.kv_cache_sizing=remember",
                   *(("--cpu",) if c.cpu else ())))
    yield startup_report(c)


def row(name: str, what: str, steps, **kw) -> Run:
    return Run(name, what, steps, env=ENV, **kw)


# tests/gpu files run on their own (the modes above run some of them among other steps); GPUs each needs
GPU_TESTS = {"test_controller_gpu": 1, "test_megatron_gpu": 1, "test_vllm_hybrid": 1, "test_agent_vllm": 1,
             "test_megatron_te": 1, "test_megatron_moe_te": 1, "test_vllm_moe": 1, "test_megatron_adam_trajectory": 1,
             "test_megatron_master_weights": 1, "test_vllm_lora": 1, "test_megatron_cp": 2, "test_megatron_layouts_gpu": 2,
             "test_weight_broadcast_nccl": 2}

ROWS = [
    row("checks", "tests/gpu (controller NCCL, megatron bf16, vLLM hybrid) + train_bench vs unfused attention", checks,
        results=("train_bench.json",)),
    row("bench", "hybrid_bench: rollout vs standalone vLLM peers alternated, gap, follow, reshard, plan vs measured",
        bench, results=("rollout_bench.json", "reshard_bench.json", "plan_vs_measured_0.5b_1gpu.json")),
    row("gap", "gap_bench per engine vs float32 on the random 1.5B (MODEL) and SmolLM2", gap,
        results=("gap_bench.json", "gap_bench_smollm2.json"), knobs={"MODEL": "/tmp/qwen2_1.5b"}),
    row("grpo", "GRPO SmolLM2 + gsm_symbolic for GRPO_TIME_S into OUT/grpo_GRPO_NAME, then grpo_report", grpo,
        results=("grpo_smollm2.json",), knobs={"GRPO_TIME_S": "420", "GRPO_NAME": "graphs", "GRPO_ARGS": ""}),
    row("agent", "tests/gpu/test_agent_vllm.py + agent_bench (multi-turn calculator vs single-turn)", agent,
        results=("agent_loop.json",)),
    row("agentgrpo", "GRPO with configs/agent_smollm2_calc.yaml (the agent loop in the hybrid worker)", agentgrpo,
        knobs={"AGENT_TIME_S": "150", "AGENT_ARGS": ""}),
    row("report", "rollout_graphs_report over the grpo (graphs, warm, eager) and gap runs of the same OUT", report,
        results=("rollout_graphs.json",)),
    row("te", "transformer-engine's GPU tests (its spec the default)", te),
    row("speed", "train_bench on SHAPE: local vs TE, padded vs packed, FP8 recipes", speed,
        results=("megatron_speed.json",),
        knobs={"SHAPE": "1.5b", "MICRO": "4", "FP8_RECIPES": "tensorwise delayed", **SPEED_KNOBS}),
    row("speed7b", "train_bench on the 7B shape, TE + packed, optimizer on the host until its step", speed7b,
        results=("megatron_speed.json",), knobs={"RECOMPUTE_RUN": "1", **SPEED_KNOBS}),
    row("speed7bcmp", "the 7B shape's te_vs_local and packed_vs_padded", speed7bcmp, results=("megatron_speed.json",),
        knobs=SPEED_KNOBS),
    row("update7b", "issue 39: where the whole 7B update's time goes, serial and overlapped onload (update_split.py)",
        update7b, knobs={"SAMPLES": "64", "UPDATES": "2", "ROOMY_GB": "60", "SCALE_MODELS": "/tmp",
                         "UPDATE_RUNS": "serial_4096 plan_4096 roomy_4096 serial_8192"}),
    row("moe", "GRPO on the random Qwen3-MoE moe_1b, router replay off and R3, gap_bench, moe_report", moe,
        results=("moe_grpo.json",), knobs={"MODEL": "/tmp/qwen3_moe_1b", "MOE_STEPS": "4", "MOE_ARGS": ""}),
    row("moetest", "tests/gpu/test_vllm_moe.py (tiny Qwen3-MoE: sync, follow, routing agreement, R3)",
        moetest),
    *[row(f"scale_{s}", f"issue 19's scale curve, the {s} shape through the real trainer", scale(s),
          results=("megatron_scale.json",), knobs=SCALE_KNOBS, cpu=True) for s in SCALE_SHAPES],
    row("scalemodel", "build the random scale models only", scalemodel, knobs={"SCALE_MODELS": "/tmp"},
        params="SHAPE..."),
    *[row(f"gpu_test_{name.removeprefix('test_')}", f"tests/gpu/{name}.py alone", gpu_test(name), gpus=gpus)
      for name, gpus in GPU_TESTS.items()],
    *[row(f"lora_7b_{v}", f"issue 40: the 7B workload, {'full fine-tuning' if v == 'full' else 'LoRA rank 32'}"
          f"{' with the engine awake (free_cache_engine=false)' if v == 'awake' else ''}, into OUT/lora_7b_{v}",
          lora_7b(v), knobs=LORA_KNOBS, cpu=True) for v in VARIANTS_7B],
    *[row(f"lora_{v}", f"issue 40: GRPO SmolLM2 for GRPO_TIME_S, {'full fine-tuning' if v.endswith('full') else 'LoRA'}"
          f", into OUT/lora_{v}", lora_smol(v), knobs=LORA_KNOBS, cpu=True) for v in VARIANTS_SMOL],
    row("startup_smol", "issue 39: the SmolLM2 job's start-up table, cold (empty vLLM/Triton caches) then warm, "
        "two steps each (startup_bench.py)", startup_smol, results=("startup.json",), cpu=True),
    row("startup_7b", "issue 39: the 7B shape's start-up table (four_gpu 7b_big_1gpu, two steps), then the report",
        startup_7b, results=("startup.json",), cpu=True, knobs={"MODELS": "/tmp"}),
    row("lora_report", "issue 40: lora_bench.py's report over OUT/lora_* (LoRA vs full: sync, peak memory, gap, "
        "val gain)", lora_report, results=("lora.json",), gpus=0, cpu=True),
]
