"""The peer rows of the run table (runs.py): verl 0.9.1 and hybridrl, the same GRPO job on the same GPU, one row per
device call. settings.py gives every trainer's overrides; report.py reads what each run leaves in OUT/NAME/
(command.txt, device.txt, gpu_mem_mib.txt sampled every 0.5 s, launched_at / first_metrics_at / ended_at) and the
log OUT/NAME.log. Staging (unpacking .gpu_verl, the checks of both environments, the model folders) is shell:
`run.sh stage` and `run.sh stage_megatron` (README.md says which lease needs which).

Issue 18's rows (`padded`: padded batches and fixed micro-batches on both sides) are the SmolLM2 and random 1.5B jobs
of peer_verl.md; issue 34's rows give each trainer its best documented settings (peer_verl_megatron.json).
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from peer_verl import settings
from procs import kill_run
from rows_one_gpu import smol_dir
from runner import ROOT, Actions, Capture, Command, Context, Run, Step, bash_quote, fresh_folder, run_gpus

HERE = os.path.dirname(os.path.abspath(__file__))
SMOL_DATA = "benchmarks/data/gsm_symbolic"
M15, M7 = "/tmp/m_1p5b", "/tmp/m_7b"
OURS_PATH = f"{ROOT}:/tmp/site"
# verl gets its own transformers (and tokenizers, hub) first; the shims folder's sitecustomize.py runs in every
# process it starts. hybridrl never sees /tmp/verl_site.
VERL_PATH = f"{HERE}/shims:/tmp/verl_site:/tmp/site"
ENV = {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "HYBRIDRL_MODEL_CACHE": "/tmp/mcache", "WANDB_MODE": "disabled",
       "RAY_USAGE_STATS_ENABLED": "0"}
# STEPS: the job's steps (settings.py's otherwise); CAP: the trainer's time cap; OURS_ARGS / VERL_ARGS: diagnosis
# only (an override tried on one side; command.txt records it)
KNOBS = {"STEPS": "", "CAP": "570", "OURS_ARGS": "", "VERL_ARGS": ""}


def _smi(*query: str) -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def _now() -> str:
    return f"{time.time():.9f}"  # as `date +%s.%N`


@dataclass(frozen=True)
class Train:
    """One trainer's run with the GPU memory sampled and the start-up timed. Part 2 resumes verl from its last
    checkpoint in a second device call (verl's SmolLM2 run outlives one call): its metrics, times and memory samples
    go to *.2 files that report.py joins to the first part's."""

    name: str
    folder: str
    argv: tuple[str, ...]
    metrics: str  # the file whose first line marks the first step's end
    suffix: str = ""  # "" for part 1, ".2" for part 2
    cap_s: int = 570
    gpus: str = "0"  # the GPUs it runs on (its CUDA_VISIBLE_DEVICES), sampled and cleared after it
    placeholder: Any = 0

    def commands(self) -> list[tuple[str, ...]]:
        return [self.argv]

    def perform(self, ctx: Context) -> int:
        if not self.suffix:  # part 2 adds its *.2 files beside part 1's
            fresh_folder(self.folder)
        os.makedirs(self.folder, exist_ok=True)
        at = lambda name: os.path.join(self.folder, name + self.suffix)  # noqa: E731
        with open(at("command.txt"), "w") as f:
            f.write("".join(bash_quote(w) + " " for w in self.argv))
        with open(at("device.txt"), "w") as f:
            f.write("".join(name + "\n" for name in _smi("--query-gpu=name", "--format=csv,noheader")[:1]))
        samples = open(os.path.join(self.folder, "gpu_mem_mib.txt"), "a")
        try:
            sampler = subprocess.Popen(["nvidia-smi", "-i", self.gpus, "--query-gpu=memory.used",
                                        "--format=csv,noheader,nounits", "-lms", "500"], stdout=samples,
                                       stderr=subprocess.DEVNULL)
        except OSError:
            sampler = None
        launched, done = _now(), threading.Event()
        watcher = threading.Thread(target=self._first_metrics, args=(at("first_metrics_at"), done), daemon=True)
        watcher.start()
        marker = ("HYBRIDRL_PEER_RUN", f"{self.name}-{os.getpid()}-{launched}")
        rc = Step(self.name, self.cap_s, self.argv, env=dict([marker])).perform(ctx)
        for name, value in (("launched_at", launched), ("ended_at", _now())):
            with open(at(name), "w") as f:
                f.write(value + "\n")
        done.set()
        if sampler:
            sampler.terminate()
            sampler.wait()
        samples.close()
        watcher.join()
        self._clear_gpus("=".join(marker))
        peak = max((int(v) for v in open(os.path.join(self.folder, "gpu_mem_mib.txt")) if v.strip().isdigit()),
                   default="")
        lines = sum(1 for _ in open(self.metrics)) if os.path.exists(self.metrics) else 0
        print(f"peak GPU memory {peak} MiB; metrics lines {lines}", flush=True)
        return rc

    def _first_metrics(self, path: str, done: threading.Event) -> None:
        while not done.is_set():
            if os.path.exists(self.metrics) and os.path.getsize(self.metrics) > 0:
                with open(path, "w") as f:
                    f.write(_now() + "\n")
                return
            done.wait(0.5)

    def _clear_gpus(self, marker: str) -> None:
        """A run killed by its cap can leave Ray workers holding GPU memory: kill what this run started (never
        `ray stop`, which would end a run on the machine's other GPUs), then wait (30 s at most) until the run's
        fullest GPU has let go, so the next run starts on free GPUs."""
        kill_run(marker)
        for _ in range(30):
            used = [int(v) for v in _smi("-i", self.gpus, "--query-gpu=memory.used", "--format=csv,noheader,nounits")
                    if v.isdigit()]
            if not used or max(used) < 2000:
                return
            time.sleep(1)


def gpu_gib(c: Context) -> Actions:
    """GiB of the first GPU, 80 where nvidia-smi says nothing: settings.py adds the 80 GB offloads below 100."""
    mib = yield Capture(("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"), placeholder="",
                        line=0)
    return float(f"{int(mib) / 1024:.0f}") if mib.isdigit() else 80.0


def ours_smol_dir(c: Context) -> Capture:
    return smol_dir(c, env={"PYTHONPATH": OURS_PATH})


def train(c: Context, name: str, trainer: str, job: str, model: str, part: int = 1, padded: bool = False,
          extra: tuple[str, ...] = (), gib: Optional[float] = None) -> Actions:
    folder = c.path(name)
    suffix = "" if part == 1 else f".{part}"
    metrics = os.path.join(folder, "logs", "metrics.jsonl") if trainer == "ours" else f"{folder}/metrics.jsonl{suffix}"
    gib = gib or (yield from gpu_gib(c))
    steps = int(c.knob("STEPS")) if c.knob("STEPS") else None
    args = settings.overrides(trainer, job, model, folder, steps, padded, gib)
    args += [*extra, *c.words("OURS_ARGS" if trainer == "ours" else "VERL_ARGS")]
    gpus = run_gpus(settings.GPUS[job], "this peer row")
    if trainer == "ours":
        cmd = ("env", f"CUDA_VISIBLE_DEVICES={gpus}", f"PYTHONPATH={OURS_PATH}", "VLLM_ENABLE_V1_MULTIPROCESSING=0",
               c.python, "-m", "hybridrl.trainer.main_ppo", *args)
    else:  # verl's Megatron examples export CUDA_DEVICE_MAX_CONNECTIONS=1 (communication/compute overlap)
        megatron = ("CUDA_DEVICE_MAX_CONNECTIONS=1",) if trainer == "verl_megatron" else ()
        cmd = ("env", f"CUDA_VISIBLE_DEVICES={gpus}", f"PYTHONPATH={VERL_PATH}", f"VERL_FILE_LOGGER_PATH={metrics}",
               *megatron, c.python, f"{HERE}/launch_verl.py", *args)
    yield Train(name, folder, cmd, metrics, suffix, int(c.knob("CAP")), gpus)


# ------------------------------------------------------------------------------------------------ issue 18 (padded)
def padded(name: str, trainer: str, job: str):
    def steps(c: Context) -> Actions:
        model = M15 if job == "1p5b" else (yield ours_smol_dir(c))
        yield from train(c, name, trainer, job, model, padded=True)
    return steps


def smol_seed(trainer: str):
    """The SmolLM2 job with another data order (SEED=N) into OUT/TRAINER_smol_seedN: each side's run-to-run spread."""
    def steps(c: Context) -> Actions:
        seed = c.knob("SEED") or _need("SEED")
        yield from train(c, f"{trainer}_smol_seed{seed}", trainer, "smol", (yield ours_smol_dir(c)), padded=True,
                         extra=(f"data.seed={seed}",))
    return steps


def verl_order(c: Context) -> Actions:
    """hybridrl on verl's prompt order (verl_order.py), unshuffled: the same prompts each step as verl's run."""
    rc = yield Command((c.python, f"{HERE}/verl_order.py", "--data", f"{SMOL_DATA}/train.parquet", "--seed", "1",
                        "--expect-rows", "4096", "--out", "/tmp/verl_order/train.parquet"))
    if rc:
        return
    yield from train(c, "ours_smol_verl_order", "ours", "smol", (yield ours_smol_dir(c)), padded=True,
                     extra=("data.train_files=[/tmp/verl_order/train.parquet]", "data.shuffle=false"))


def verl_part(job: str, part: int):
    """verl in two calls of one lease: part 1 saves every SAVE_FREQ steps and stops at its cap; part 2 resumes from
    the last save without validating again first."""
    def steps(c: Context) -> Actions:
        model = M15 if job == "1p5b" else (yield ours_smol_dir(c))
        extra = (f"trainer.save_freq={c.knob('SAVE_FREQ')}",)
        if part == 2:
            extra += ("trainer.resume_mode=auto", "trainer.val_before_train=false")
        yield from train(c, f"verl_{job}", "verl", job, model, part, padded=True, extra=extra)
    return steps


# ------------------------------------------------------------------------------------------------ issue 34 (best)
def best(name: str, trainer: str, job: str, seeded: bool = False):
    def steps(c: Context) -> Actions:
        model = {"1p5b": M15, "7b": M7, "7b_4gpu": M7}.get(job) or (yield ours_smol_dir(c))
        gib = yield from gpu_gib(c)
        if not c.listing:
            have = yield Capture(("nvidia-smi", "--query-gpu=count", "--format=csv,noheader"), placeholder="", line=0)
            if not os.path.exists(os.path.join(model, "config.json")):
                raise SystemExit(f"no model at {model}: run.sh stage_megatron first")
            if int(have or 0) < settings.GPUS[job]:
                raise SystemExit(f"{name} needs {settings.GPUS[job]} GPUs, this machine has {have or 0}")
            if job == "7b" and gib < 100:  # 137 GB of training state: `hybridrl plan` refuses it on 80 GB
                raise SystemExit(f"{name} needs an H200 (this GPU: {gib:.0f} GiB): the one-GPU 7B job does not fit 80 GB")
        seed = (c.knob("SEED") or _need("SEED")) if seeded else ""
        yield from train(c, f"{name}{seed}", trainer, job, model, extra=(f"data.seed={seed}",) if seeded else (), gib=gib)
    return steps


def report(flag: tuple[str, ...], out: str):
    def steps(c: Context) -> Actions:
        yield Command((c.python, f"{HERE}/report.py", *flag, "--runs", c.out, "--out", c.path("results", out)),
                      env={"PYTHONPATH": OURS_PATH})
    return steps


def stage(mode: str):
    def steps(c: Context) -> Actions:
        yield Command(("bash", "benchmarks/peer_verl/run.sh", mode))
    return steps


def _need(knob: str) -> str:
    raise SystemExit(f"this row needs {knob}: --set {knob}=N")


def row(mode: str, what: str, steps, job: str = "", results: tuple[str, ...] = (),
        knobs: Optional[Mapping[str, str]] = None) -> Run:
    return Run(f"peer_{mode}", what, steps, gpus=settings.GPUS.get(job, 1), results=results,
               knobs={**KNOBS, **(knobs or {})}, env=ENV)


SEED, SAVE = {"SEED": ""}, {"SAVE_FREQ": "5"}
ROWS = [
    row("stage", "unpack .gpu_verl, check both environments, SmolLM2's HF folder and the random 1.5B (shell)",
        stage("stage")),
    row("stage_megatron", "stage + verl's Megatron path checked on the GPU, the 1.5B and 7B folders with weights (shell)",
        stage("stage_megatron")),
    *[row(f"{t}_{j}", f"{t} on the {j} job, issue 18's padded settings", padded(f"{t}_{j}", t, j), j)
      for j in ("smol", "1p5b") for t in ("verl", "ours")],
    row("ours_smol_seed", "ours_smol with data.seed=SEED (hybridrl's spread)", smol_seed("ours"), "smol", knobs=SEED),
    row("verl_smol_seed", "verl_smol with data.seed=SEED (verl's spread)", smol_seed("verl"), "smol", knobs=SEED),
    row("ours_smol_verl_order", "ours_smol on verl's prompt order, unshuffled", verl_order, "smol"),
    *[row(f"verl_{j}_{p}", f"verl_{j} in two calls of one lease, part {p}", verl_part(j, p), j, knobs=SAVE)
      for j in ("smol", "1p5b") for p in (1, 2)],
    row("report", "report.py over issue 18's runs", report((), "peer_verl.json"), results=("peer_verl.json",)),
    *[row(f"verl_megatron_{j}", f"verl's Megatron backend on the {j} job, its best settings",
          best(f"verl_megatron_{j}", "verl_megatron", j), j) for j in ("smol", "1p5b", "7b", "7b_4gpu")],
    *[row(f"{t}_{j}", f"{t} on the {j} job, its best settings", best(f"{t}_{j}", t, j), j)
      for t, j in (("verl", "7b"), ("verl", "7b_4gpu"), ("ours", "7b"), ("ours", "7b_4gpu"))],
    *[row(f"ours_best_{j}", f"hybridrl's best settings on issue 18's {j} job", best(f"ours_best_{j}", "ours", j), j)
      for j in ("smol", "1p5b")],
    row("ours_best_smol_seed", "ours_best_smol with data.seed=SEED (the spread for the parity with verl_megatron_smol)",
        best("ours_best_smol_seed", "ours", "smol", seeded=True), "smol", knobs=SEED),
    row("report_megatron", "report.py --megatron over issue 34's runs", report(("--megatron",), "peer_verl_megatron.json"),
        results=("peer_verl_megatron.json",)),
]
