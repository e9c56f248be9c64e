"""The two-GPU rows of the run table (runs.py), issue 8's layouts and issue 21's split placement: staging the random
1.5B model, tp/pp/dp parity against one GPU with the NCCL all-gather floor, GRPO through Ray on one or two GPUs
(preset 1.5b_2gpu), and multi_gpu_bench's report -> results/two_gpu.json. Every row has a CPU dry run (`runs.py dry
NAME`): the same steps on gloo with the tiny model and the torch engine. two_gpu.md lists the calls of one lease.
"""
from __future__ import annotations

from runner import ROOT, Actions, Command, Context, Note, Run, Step, WriteJson

ARA = "actor_rollout_ref"
ENV = {"PYTHONPATH": f"{ROOT}:/tmp/site", "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "HF_HUB_OFFLINE": "1",
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
KNOBS = {"MODEL": "/tmp/qwen2_1.5b", "STEPS": "5", "GRPO_TIME_S": "400"}
TP = f"{ARA}.actor.megatron.tensor_model_parallel_size"
RTP = f"{ARA}.rollout.tensor_model_parallel_size"
# issue 21's split placement: 1 training GPU + 1 rollout GPU, weights by NCCL broadcast; its rows are read against
# grpo_2gpu_dp of the same lease (timing_s/step, async/staleness, weight_broadcast/*)
SPLIT = (f"{ARA}.hybrid_engine=false", f"{ARA}.rollout.n_gpus_per_node=1", f"{ARA}.rollout.calculate_log_probs=true")


def step(name: str, cap_s: int, argv: tuple[str, ...]) -> Step:
    return Step(name, cap_s, argv, tail=6)


def stage(c: Context) -> Actions:
    if not c.cpu:
        rc = yield Command(("bash", "/tmp/b/unpack.sh", "/tmp/site"), stdout=c.path("unpack.log"))
        yield Note(f"unpack rc={rc}")
        yield Command(("nvidia-smi", "-L"))
    yield step("model", 300, (c.python, "benchmarks/multi_gpu_bench.py", "model", "--dir", c.knob("MODEL"),
                              "--shape", "tiny" if c.cpu else "1.5b"))


def parity(c: Context) -> Actions:
    """tp=2, pp=2, dp=2 against one GPU (log-probs, one update) + NCCL all-gather bandwidth."""
    device = ("--cpu",) if c.cpu else ()

    def torchrun(n: int, *args: str) -> tuple[str, ...]:
        return (c.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                "benchmarks/multi_gpu_bench.py", *args)

    model = c.knob("MODEL")
    for name, n, layout, out in (("parity_1gpu", 1, (), "tp1_pp1_dp1"), ("parity_tp2", 2, ("--tp", "2"), "tp2_pp1_dp1"),
                                 ("parity_pp2", 2, ("--pp", "2"), "tp1_pp2_dp1"), ("parity_dp2", 2, (), "tp1_pp1_dp2")):
        yield step(name, 240, torchrun(n, "parity", *device, "--dir", model, *layout,
                                       "--out", c.path(f"parity_{out}.json")))
    yield step("allgather", 120, torchrun(2, "allgather", *device, "--out", c.path("allgather.json")))


def grpo_command(c: Context, folder: str, gpus: str, overrides: tuple[str, ...]) -> tuple[str, ...]:
    model = c.knob("MODEL")
    device = ((f"{ARA}.rollout.name=torch", "trainer.device=cpu") if c.cpu
              else (f"{ARA}.rollout.name=vllm", "trainer.device=cuda"))
    return (c.python, "-m", "hybridrl.trainer.main_ppo", "--config-name", "grpo_trainer", "preset=1.5b_2gpu",
            f"{ARA}.model.path={model}", f"data.train_files={model}/data/train.parquet",
            f"data.val_files={model}/data/test.parquet", "data.max_prompt_length=64",
            f"data.max_response_length={16 if c.cpu else 256}", "data.train_batch_size=32",
            f"{ARA}.actor.ppo_mini_batch_size=32", f"{ARA}.rollout.n=8", f"{ARA}.actor.use_kl_loss=true",
            f"{ARA}.rollout.ignore_eos=true", f"{ARA}.rollout.gpu_memory_utilization=0.4", *device,
            f"trainer.n_gpus_per_node={gpus}", f"trainer.total_training_steps={c.knob('STEPS')}", "trainer.test_freq=-1",
            "trainer.save_freq=-1", "trainer.val_before_train=false", "trainer.logger=[console,jsonl]",
            "trainer.progress_bar=false", f"trainer.default_local_dir={folder}",
            f"trainer.max_time_s={c.knob('GRPO_TIME_S')}", *overrides)


def grpo_run(c: Context, name: str, gpus: str, overrides: tuple[str, ...]) -> Actions:
    """The real trainer (Ray controller, vLLM) on `gpus` GPUs with preset 1.5b_2gpu and the extra overrides, into
    OUT/grpo_NAME (run.json: the GPU count and the two tp sizes, for the report)."""
    folder = c.path(f"grpo_{name}")
    sizes = {k: int(v) for k, v in (o.split("=", 1) for o in overrides if o.startswith((TP + "=", RTP + "=")))}
    yield WriteJson(f"{folder}/run.json", {"gpus": int(gpus), "actor_tp": sizes.get(TP, 1),
                                           "rollout_tp": sizes.get(RTP, 1), "preset": "1.5b_2gpu"}, indent=None)
    yield step(f"grpo_{name}", 580, grpo_command(c, folder, gpus, overrides))


def grpo(name: str, gpus: int, *overrides: str):
    def steps(c: Context) -> Actions:
        yield from grpo_run(c, name, str(gpus), (*overrides, *c.args))
    return steps


def grpo_any(c: Context) -> Actions:
    """`multi_grpo NAME NGPUS [OVERRIDES...]`: a GRPO run of one's own naming (the named rows are its instances)."""
    if len(c.args) < 2:
        raise SystemExit("multi_grpo needs NAME NGPUS [overrides...]")
    yield from grpo_run(c, c.args[0], c.args[1], tuple(c.args[2:]))


def report(c: Context) -> Actions:
    yield Command((c.python, "benchmarks/multi_gpu_bench.py", "report", "--in-dir", c.out,
                   "--out", c.path("results", "two_gpu.json"), "--command",
                   "OUT=$OUT python3 benchmarks/runs.py run {multi_stage,parity,grpo_1gpu,grpo_2gpu_dp,grpo_2gpu_tp,"
                   "grpo_2gpu_tp_to_dp,multi_report}"), tail=60)


def row(name: str, what: str, steps, gpus: int = 2, **kw) -> Run:
    return Run(name, what, steps, gpus=gpus, knobs=KNOBS, cpu=True, env=ENV, **kw)


ROWS = [
    row("multi_stage", "unpack the bundle, build the random 1.5B model (MODEL)", stage),
    row("parity", "tp2, pp2, dp2 against one GPU + the NCCL all-gather floor", parity),
    row("multi_grpo", "GRPO through Ray, preset 1.5b_2gpu, named and laid out on the command line", grpo_any,
        params="NAME NGPUS [OVERRIDES...]"),
    *[row(f"grpo_{name}", f"GRPO through Ray on {n} GPU(s), preset 1.5b_2gpu{': ' + note if note else ''}",
          grpo(name, n, *extra), gpus=1 if name == "1gpu" else 2)
      for name, n, extra, note in [
          ("1gpu", 1, (), ""),
          ("2gpu_dp", 2, (), "actor dp2 -> vLLM dp_g2 (no cross-GPU traffic)"),
          ("2gpu_tp", 2, (f"{TP}=2", f"{RTP}=2"), "actor tp2 -> vLLM tp_g2 (shard to shard)"),
          ("2gpu_tp_to_dp", 2, (f"{TP}=2", f"{RTP}=1"), "actor tp2 -> vLLM tp_g1 dp_g2 (every rank gathers all)"),
          ("split_sync", 1, SPLIT, "rollout on its own GPU, synchronous"),
          ("one_step_off", 1, (*SPLIT, "trainer.one_step_off_policy=true"), "generation of k+1 during update k")]],
    row("multi_report", "multi_gpu_bench report over the runs of the same OUT", report, results=("two_gpu.json",)),
]
