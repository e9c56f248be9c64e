"""The ONE validation pass: checks a built PPOConfig and derives every size the job needs.

Nothing below the entry points recomputes these numbers or edits the config: workers receive the
frozen config and the frozen `Derived` sizes. Every problem found is reported at once, each naming
the keys involved and a fix.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from .algorithm_checks import check_algorithm
from .attention_backends import BACKENDS, backend_name
from .layout import BatchPlan, Derived, ParallelLayout, RunConfig
from .lora_checks import check_lora
from .placement import check_placement
from .problems import Problems as _Problems
from .problems import choices as _choices
from .problems import did_you_mean as _did_you_mean
from .problems import registry_names as _registry_names
from .reward_checks import check_reward_model
from .rollout_checks import check_multi_turn, check_rollout
from .schema import MegatronConfig, PPOConfig
from .schema.common import LAYOUT_KEYS

ARA = "actor_rollout_ref"
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
# Accepted for verl compatibility; they change nothing here (a non-default value gets a note).
NO_EFFECT = {
    "data.use_shm": False,
    "data.dataloader_num_workers": 8,
    "data.filter_overlong_prompts_workers": 1,
    f"{ARA}.actor.use_torch_compile": True,
    f"{ARA}.ref.use_torch_compile": True,
    f"{ARA}.model.use_fused_kernels": False,
    f"{ARA}.actor.checkpoint.async_save": False,
    "trainer.esi_redundant_time": 0,
    "trainer.default_hdfs_dir": None,
    "trainer.del_local_ckpt_after_load": False,
    "trainer.ray_wait_register_center_timeout": 300,
}


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


# ---------------------------------------------------------------------------------------------- layout
def _device(cfg: PPOConfig, p: _Problems, cuda_available: Callable[[], bool]) -> str:
    want = cfg.trainer.device
    if not p.check(want in ("auto", "cuda", "cpu"), f"trainer.device={want!r} is not one of auto, cuda, cpu"):
        return "cpu"
    if want == "auto":
        return "cuda" if cuda_available() else "cpu"
    p.check(want == "cpu" or cuda_available(), "trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu")
    return want


def _layout(key: str, m: MegatronConfig, world: int, device: str, p: _Problems) -> ParallelLayout:
    tp, pp, cp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size
    for name, v in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp), ("context_parallel_size", cp)):
        p.check(v >= 1, f"{key}.{name}={v} must be >= 1")
    tp, pp, cp = max(tp, 1), max(pp, 1), max(cp, 1)
    model_parallel = tp * pp * cp
    p.check(world % model_parallel == 0,
            f"{key}: tp*pp*cp = {tp}*{pp}*{cp} = {model_parallel} does not divide the {world} ranks "
            f"(trainer.nnodes * trainer.n_gpus_per_node); choose sizes whose product divides {world}")
    vpp = m.virtual_pipeline_model_parallel_size
    p.check(vpp is None or (vpp >= 1 and pp > 1),
            f"{key}.virtual_pipeline_model_parallel_size={vpp} needs pipeline_model_parallel_size > 1 (got {pp}); set it to null")
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size
    p.check(ep >= 1, f"{key}.expert_model_parallel_size={ep} must be >= 1")
    p.check(etp is None or etp >= 1, f"{key}.expert_tensor_parallel_size={etp} must be null (= tensor_model_parallel_size) or >= 1")
    ep, etp = max(ep, 1), (max(etp, 1) if etp is not None else None)
    per_stage = world // pp if world % pp == 0 else 0
    p.check(per_stage % (ep * (etp or tp)) == 0,
            f"{key}: expert_model_parallel_size * expert_tensor_parallel_size = {ep}*{etp or tp} does not divide the "
            f"{per_stage} ranks of a pipeline stage (world {world} / pipeline_model_parallel_size {pp}); experts are "
            "spread over the tensor and data parallel ranks of a stage: choose sizes whose product divides it")
    p.check(m.dtype in ("bfloat16", "float16", "float32"), f"{key}.dtype={m.dtype!r} is not one of bfloat16, float16, float32")
    dtype = m.dtype if device == "cuda" else "float32"
    if device == "cpu" and any((m.param_offload, m.grad_offload, m.optimizer_offload)):
        p.notes.append(f"{key}: *_offload has no effect on CPU (state already lives in host memory)")
    return ParallelLayout(world, tp, pp, cp, vpp, max(world // model_parallel, 1), m.sequence_parallel and tp > 1, dtype,
                          ep=ep, etp=etp)


def _check_transformer_overrides(key: str, m: MegatronConfig, p: _Problems) -> None:
    """override_transformer_config: megatron TransformerConfig fields only, attention_backend one the
    adapter runs (megatron would fail later, inside a worker, with a bare TypeError)."""
    overrides = m.override_transformer_config or {}
    if not overrides:
        return
    if "attention_backend" in overrides:  # backend_name: null means auto, as in the adapter
        _choices(f"{key}.override_transformer_config.attention_backend", backend_name(overrides["attention_backend"]),
                 list(BACKENDS), p)
    try:
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:  # the driver may run without megatron; the workers check again when they build
        return
    names = [f.name for f in dataclasses.fields(TransformerConfig)]
    for k in overrides:
        p.check(k in names, f"{key}.override_transformer_config.{k} is not a megatron TransformerConfig field"
                            f"{_did_you_mean(k, names)}")


FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")  # tensorwise: current scaling


def _check_transformer_impl(key: str, m: MegatronConfig, device: str, te_available: Callable[[], bool],
                            p: _Problems) -> None:
    """transformer_impl, and what only transformer-engine layers run: FP8 and context parallelism."""
    impl = m.transformer_impl
    _choices(f"{key}.transformer_impl", str(impl), ["transformer_engine", "local", "None"], p)
    if impl == "transformer_engine":
        p.check(device == "cuda", f"{key}.transformer_impl=transformer_engine needs a GPU (trainer.device is {device}); "
                                  "set it to local or null")
        p.check(device != "cuda" or te_available(),
                f"{key}.transformer_impl=transformer_engine but transformer_engine does not import here; install "
                "transformer-engine or set it to local (or null: TE where it imports)")
    te = device == "cuda" and impl != "local" and te_available()
    cp = m.context_parallel_size
    p.check(cp <= 1 or te, f"{key}.context_parallel_size={cp} needs transformer-engine attention: set "
                           f"{key}.transformer_impl=transformer_engine on a GPU (trainer.device=cuda) with transformer_engine "
                           "installed, or set context_parallel_size=1")
    overrides = m.override_transformer_config or {}
    p.check(not overrides.get("moe_grouped_gemm") or te,
            f"{key}.override_transformer_config.moe_grouped_gemm=true runs a mixture of experts' experts as "
            f"transformer-engine's grouped GEMM: set {key}.transformer_impl=transformer_engine on a GPU "
            "(trainer.device=cuda) with transformer_engine installed, or remove moe_grouped_gemm (the TE spec "
            "groups the experts by default; the local spec runs them one after another)")
    fp8, recipe = overrides.get("fp8"), overrides.get("fp8_recipe")
    if fp8 is not None:
        _choices(f"{key}.override_transformer_config.fp8", str(fp8), list(FP8_FORMATS), p)
        p.check(te, f"{key}.override_transformer_config.fp8={fp8} needs transformer-engine layers: set "
                    f"{key}.transformer_impl=transformer_engine on a GPU (trainer.device=cuda), or remove fp8")
    if recipe is not None:
        _choices(f"{key}.override_transformer_config.fp8_recipe", str(recipe), list(FP8_RECIPES), p)
        p.check(fp8 is not None, f"{key}.override_transformer_config.fp8_recipe={recipe} without fp8: set "
                                 f"{key}.override_transformer_config.fp8=e4m3 (or hybrid), or remove fp8_recipe")


def _engine_keys(m: MegatronConfig) -> tuple:
    overrides = m.override_transformer_config or {}
    return m.transformer_impl, overrides.get("fp8"), overrides.get("fp8_recipe")


def _same_layout(key: str, m: MegatronConfig, actor: MegatronConfig, p: _Problems) -> None:
    for k in LAYOUT_KEYS:
        mine, theirs = getattr(m, k), getattr(actor, k)
        p.check(mine == theirs,
                f"{key}.{k}={mine} differs from {ARA}.actor.megatron.{k}={theirs}: this role runs in the actor's "
                f"processes and megatron-core keeps one layout per process; remove the override or make them equal")


def _micro(key: str, global_micro: Optional[int], per_gpu: Optional[int], dp: int, p: _Problems,
           global_name: str, per_gpu_name: str) -> Optional[int]:
    if global_micro is not None and per_gpu is not None:
        p.errors.append(f"{key}.{global_name} and {key}.{per_gpu_name} are both set; keep only {per_gpu_name}")
        return per_gpu
    if global_micro is not None:
        if not p.check(global_micro % dp == 0 and global_micro >= dp,
                       f"{key}.{global_name}={global_micro} is not a multiple of dp={dp}; set {key}.{per_gpu_name} instead"):
            return None
        return global_micro // dp
    return per_gpu


def _batch_plan(key: str, role: Any, dp: int, n: int, cfg: PPOConfig, p: _Problems,
                forward_global: Optional[int], forward_per_gpu: Optional[int], forward_names: tuple[str, str],
                forward_key: str, forward_max_tokens: int) -> BatchPlan:
    prompts = cfg.data.train_batch_size
    mini = role.ppo_mini_batch_size
    ok = p.check(mini >= 1, f"{key}.ppo_mini_batch_size={mini} must be >= 1") and p.check(
        mini <= prompts and prompts % mini == 0,
        f"{key}.ppo_mini_batch_size={mini} must divide data.train_batch_size={prompts} (both count prompts); "
        f"e.g. set it to {_divisor_near(prompts, mini)}")
    mini_samples = max(mini, 1) * n
    ok = ok and p.check(mini_samples % dp == 0,
                  f"{key}.ppo_mini_batch_size * rollout.n = {mini}*{n} = {mini_samples} samples cannot be split evenly "
                  f"over dp={dp} ranks; make it a multiple of {dp}")
    per_dp = max(mini_samples // dp, 1)
    micro = _micro(key, role.ppo_micro_batch_size, role.ppo_micro_batch_size_per_gpu, dp, p,
                   "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu")
    accum = None
    if role.use_dynamic_bsz:
        longest = cfg.data.max_prompt_length + cfg.data.max_response_length
        p.check(role.ppo_max_token_len_per_gpu >= longest,
                f"{key}.ppo_max_token_len_per_gpu={role.ppo_max_token_len_per_gpu} is below the longest sequence "
                f"(data.max_prompt_length + data.max_response_length = {longest}); raise it")
        micro = None
    elif micro is None:
        p.errors.append(f"{key}.ppo_micro_batch_size_per_gpu is not set; set it to a divisor of {per_dp} "
                        f"(the per-rank mini-batch) or set {key}.use_dynamic_bsz=true")
    elif p.check(micro >= 1, f"{key}.ppo_micro_batch_size_per_gpu={micro} must be >= 1") and ok:
        if p.check(per_dp % micro == 0,
                   f"{key}.ppo_micro_batch_size_per_gpu={micro} does not divide the per-rank mini-batch of {per_dp} samples "
                   f"(ppo_mini_batch_size*rollout.n/dp = {mini}*{n}/{dp}); e.g. set it to {_divisor_near(per_dp, micro)}"):
            accum = per_dp // micro
    p.check(role.ppo_epochs >= 1, f"{key}.ppo_epochs={role.ppo_epochs} must be >= 1")
    fwd = _micro(forward_key, forward_global, forward_per_gpu, dp, p, *forward_names)
    if fwd is None and not role.use_dynamic_bsz:
        fwd = micro
        if micro is not None:
            p.notes.append(f"{forward_key}.{forward_names[1]} not set: using {micro} ({key}.ppo_micro_batch_size_per_gpu)")
    return BatchPlan(
        samples_per_step=prompts * n,
        mini_batch_samples=mini_samples,
        mini_batches_per_epoch=max(prompts // max(mini, 1), 1),
        ppo_epochs=max(role.ppo_epochs, 1),
        mini_batch_per_dp=per_dp,
        micro_batch_per_gpu=micro,
        grad_accum=accum,
        use_dynamic_bsz=role.use_dynamic_bsz,
        max_token_len_per_gpu=role.ppo_max_token_len_per_gpu,
        forward_micro_batch_per_gpu=fwd,
        forward_max_token_len_per_gpu=forward_max_tokens,
    )


def _divisor_near(n: int, want: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0] or [1]
    return min(divisors, key=lambda d: (abs(d - max(want, 1)), d))


# ---------------------------------------------------------------------------------------------- sections
def _check_data(cfg: PPOConfig, p: _Problems) -> None:
    d = cfg.data
    p.check(d.train_batch_size >= 1, f"data.train_batch_size={d.train_batch_size} must be >= 1")
    p.check(d.max_prompt_length >= 1, f"data.max_prompt_length={d.max_prompt_length} must be >= 1")
    p.check(d.max_response_length >= 1, f"data.max_response_length={d.max_response_length} must be >= 1")
    p.check(d.val_batch_size is None or d.val_batch_size >= 1, "data.val_batch_size must be null or >= 1")
    _choices("data.truncation", d.truncation, ["error", "left", "right", "middle"], p)
    p.check(bool(d.train_files), "data.train_files is empty; give one or more parquet/arrow/jsonl files")
    p.check((d.custom_cls.path is None) == (d.custom_cls.name is None),
            "data.custom_cls needs both path and name (a .py file and the class in it)")


def _check_actor(cfg: PPOConfig, p: _Problems) -> None:
    actor, key = cfg.actor_rollout_ref.actor, f"{ARA}.actor"
    p.check(actor.strategy == "megatron", f"{key}.strategy={actor.strategy!r}: hybridrl trains with megatron-core; set it to megatron")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        v = getattr(actor, name)
        p.check(v is None or v > 0, f"{key}.{name}={v} must be > 0")
    p.check(actor.clip_ratio_c > 1, f"{key}.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual-clip bound)")
    replay = actor.router_replay.mode
    _choices(f"{key}.router_replay.mode", replay, ["disabled", "R2", "R3"], p)
    p.check(replay != "R2", f"{key}.router_replay.mode=R2 (replaying the actor's own old-log-prob routing) is not "
                            "supported; use R3 (the rollout's routing) or disabled")
    if replay == "R3":
        p.check(cfg.actor_rollout_ref.rollout.enable_rollout_routing_replay,
                f"{key}.router_replay.mode=R3 replays the rollout's expert choices: set "
                f"{ARA}.rollout.enable_rollout_routing_replay=true")
        p.check(not cfg.actor_rollout_ref.model.enable_gradient_checkpointing,
                f"{key}.router_replay.mode=R3 with {ARA}.model.enable_gradient_checkpointing=true is not supported "
                "(the recomputed forward would need the replayed routing again); turn one of them off")
    p.check(not (cfg.actor_rollout_ref.rollout.enable_rollout_routing_replay and cfg.actor_rollout_ref.model.use_remove_padding),
            f"{ARA}.rollout.enable_rollout_routing_replay=true with {ARA}.model.use_remove_padding=true is not supported "
            "yet (routing agreement and replay map the rollout's experts onto padded micro-batches); set "
            f"{ARA}.model.use_remove_padding=false")
    if actor.optim.override_optimizer_config.get("optimizer_cpu_offload") and cfg.actor_rollout_ref.hybrid_engine:
        p.notes.append(f"{key}.optim.override_optimizer_config.optimizer_cpu_offload=true: megatron's CPU optimizer "
                       "keeps its fp32 state in host memory beside what the hybrid engine pins there (for a 7B "
                       f"model, more than a 125 GiB host holds); with {key}.megatron.optimizer_offload=true the hybrid "
                       "engine keeps the optimizer state on the host except during its step (`hybridrl plan`: "
                       "actor_step)")
    for role, optim in ((f"{key}.optim", actor.optim), ("critic.optim", cfg.critic.optim)):
        p.check(optim.lr >= 0, f"{role}.lr={optim.lr} must be >= 0")
        p.check(0 <= optim.lr_warmup_steps_ratio <= 1, f"{role}.lr_warmup_steps_ratio must be in [0, 1]")
        _choices(f"{role}.lr_decay_style", optim.lr_decay_style, list(DECAY_STYLES), p)
        _choices(f"{role}.optimizer", optim.optimizer, ["adam", "sgd"], p)
        p.check(len(optim.betas) == 2, f"{role}.betas must have two values")


def _check_interleaved_training(key: str, mini: int, batch: BatchPlan, layout: ParallelLayout, n: int,
                                p: _Problems) -> None:
    """Virtual pipeline stages: megatron-core's interleaved schedule trains on a multiple of pp micro-batches and,
    with variable sequence lengths (always here), deadlocks on exactly pp (adapters/megatron/engine.py,
    check_interleaved_count): each dp rank needs at least 2*pp samples per mini-batch."""
    if not layout.vpp:
        return
    least = 2 * layout.pp
    need = -(-least * layout.dp // n)  # ppo_mini_batch_size (prompts) giving `least` samples per dp rank
    p.check(batch.mini_batch_per_dp >= least,
            f"{key}.ppo_mini_batch_size={mini}: each dp rank gets {batch.mini_batch_per_dp} sample(s) per mini-batch "
            f"(ppo_mini_batch_size*rollout.n/dp), but with virtual_pipeline_model_parallel_size={layout.vpp} "
            f"megatron-core's interleaved schedule trains on a multiple of pipeline_model_parallel_size={layout.pp} "
            f"micro-batches and hangs on exactly {layout.pp}: at least {least} are needed; raise it to >= {need} or "
            f"unset {ARA}.actor.megatron.virtual_pipeline_model_parallel_size")


def _check_trainer(cfg: PPOConfig, p: _Problems) -> None:
    t = cfg.trainer
    p.check(t.nnodes >= 1 and t.n_gpus_per_node >= 1, "trainer.nnodes and trainer.n_gpus_per_node must be >= 1")
    p.check(t.total_epochs >= 1, f"trainer.total_epochs={t.total_epochs} must be >= 1")
    p.check(t.total_training_steps is None or t.total_training_steps >= 1, "trainer.total_training_steps must be null or >= 1")
    _choices("trainer.resume_mode", t.resume_mode, ["auto", "disable", "resume_path"], p)
    p.check(t.resume_mode != "resume_path" or bool(t.resume_from_path),
            "trainer.resume_mode=resume_path needs trainer.resume_from_path")
    for lg in t.logger:
        _choices("trainer.logger", lg, list(LOGGERS), p)
    _choices("trainer.backend", t.backend, ["ray", "local"], p)
    _choices("trainer.on_nonfinite", t.on_nonfinite, ["error", "skip"], p)
    _choices("trainer.memory_check", t.memory_check, ["error", "warn", "skip"], p)
    p.check(t.critic_warmup >= 0, "trainer.critic_warmup must be >= 0")
    p.check(t.max_time_s is None or t.max_time_s > 0, "trainer.max_time_s must be null or > 0")
    for k in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
        v = getattr(t, k)
        p.check(v is None or v >= 1, f"trainer.{k}={v} must be null or >= 1")
    p.check(t.worker_timeout_s > 0 and t.dist_timeout_s > 0, "trainer.worker_timeout_s and trainer.dist_timeout_s must be > 0")
    p.check(cfg.ray_kwargs.connect_timeout_s > 0,
            f"ray_kwargs.connect_timeout_s={cfg.ray_kwargs.connect_timeout_s} must be > 0")


def _check_profiler(cfg: PPOConfig, p: _Problems) -> None:
    g = cfg.global_profiler
    if g.tool is None:
        p.check(not g.steps, f"global_profiler.steps={g.steps} profiles nothing without global_profiler.tool=torch")
        return
    p.check(g.tool == "torch", f"global_profiler.tool={g.tool!r} is not supported (verl's nsys, npu and torch_memory "
                               "are not built in); use torch or null")
    p.check(bool(g.steps), "global_profiler.tool=torch needs global_profiler.steps, e.g. [2]")
    p.check(all(isinstance(s, int) and s >= 1 for s in g.steps or []),
            f"global_profiler.steps={g.steps} must be step numbers >= 1")


def _check_rewards(cfg: PPOConfig, p: _Problems) -> None:
    managers = _registry_names("hybridrl.reward", "REWARD_MANAGERS")
    if managers is not None:
        _choices("reward_model.reward_manager", cfg.reward_model.reward_manager, managers, p)
    path = cfg.custom_reward_function.path
    p.check(path is None or path.startswith("pkg://") or os.path.isfile(os.path.expanduser(path)),
            f"custom_reward_function.path={path}: no such file")


def _no_effect_notes(cfg: PPOConfig, p: _Problems) -> None:
    for key, default in NO_EFFECT.items():
        if _get(cfg, key) != default:
            p.notes.append(f"{key}={_get(cfg, key)!r} is accepted for verl compatibility and has no effect")


def _cuda_available() -> bool:
    """This machine's answer (validate's default; tests pass their own)."""
    import torch
    return torch.cuda.is_available()


def _te_available() -> bool:
    """Whether transformer_engine imports here (validate's default; tests pass their own)."""
    import importlib.util
    return importlib.util.find_spec("transformer_engine") is not None


# ---------------------------------------------------------------------------------------------- entry
def validate(cfg: PPOConfig, cuda_available: Optional[Callable[[], bool]] = None,
             te_available: Optional[Callable[[], bool]] = None,
             gpu_count: Optional[Callable[[], int]] = None) -> RunConfig:
    """Check `cfg` and derive all sizes. Raises ConfigError listing every problem.
    `cuda_available` / `te_available` (whether transformer_engine imports) / `gpu_count` default to this machine's."""
    cuda_available = cuda_available or _cuda_available
    te_available = te_available or _te_available
    p = _Problems()
    device = _device(cfg, p, cuda_available)
    world = max(cfg.trainer.nnodes, 1) * max(cfg.trainer.n_gpus_per_node, 1)
    ara = cfg.actor_rollout_ref
    actor = _layout(f"{ARA}.actor.megatron", ara.actor.megatron, world, device, p)
    placement = check_placement(cfg, device, p, gpu_count)
    rollout = check_rollout(cfg, device, world, p, placement)
    check_multi_turn(cfg, rollout, p)
    _check_data(cfg, p)
    _check_actor(cfg, p)
    check_lora(cfg, device, te_available, p)
    algorithm = check_algorithm(cfg, rollout.n, p)
    _check_trainer(cfg, p)
    _check_profiler(cfg, p)
    _check_rewards(cfg, p)
    _no_effect_notes(cfg, p)

    r = ara.rollout
    actor_batch = _batch_plan(
        f"{ARA}.actor", ara.actor, actor.dp, rollout.n, cfg, p,
        r.log_prob_micro_batch_size, r.log_prob_micro_batch_size_per_gpu,
        ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"), f"{ARA}.rollout",
        r.log_prob_max_token_len_per_gpu,
    )
    _check_interleaved_training(f"{ARA}.actor", ara.actor.ppo_mini_batch_size, actor_batch, actor, rollout.n, p)
    use_reference = ara.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    _same_layout(f"{ARA}.ref.megatron", ara.ref.megatron, ara.actor.megatron, p)
    for key, m in ((f"{ARA}.actor.megatron", ara.actor.megatron), (f"{ARA}.ref.megatron", ara.ref.megatron),
                   ("critic.megatron", cfg.critic.megatron)):
        _check_transformer_overrides(key, m, p)
        if m is ara.actor.megatron or _engine_keys(m) != _engine_keys(ara.actor.megatron):  # report once
            _check_transformer_impl(key, m, device, te_available, p)
    ref_micro = _micro(f"{ARA}.ref", ara.ref.log_prob_micro_batch_size, ara.ref.log_prob_micro_batch_size_per_gpu,
                       actor.dp, p, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu")
    if ref_micro is None:
        ref_micro = actor_batch.forward_micro_batch_per_gpu

    use_critic = cfg.critic.enable if cfg.critic.enable is not None else cfg.algorithm.adv_estimator == "gae"
    critic_layout = critic_batch = None
    if use_critic:
        _same_layout("critic.megatron", cfg.critic.megatron, ara.actor.megatron, p)
        # Same layout as the actor (checked above): its divisibility errors are the actor's, reported once.
        critic_layout = _layout("critic.megatron", cfg.critic.megatron, world, device, _Problems())
        critic_problems = _Problems()
        p.check(cfg.critic.rollout_n == rollout.n,
                f"critic.rollout_n={cfg.critic.rollout_n} differs from {ARA}.rollout.n={rollout.n}; remove the override")
        p.check(cfg.critic.cliprange_value > 0, "critic.cliprange_value must be > 0")
        critic_batch = _batch_plan(
            "critic", cfg.critic, critic_layout.dp, rollout.n, cfg, critic_problems,
            None, cfg.critic.forward_micro_batch_size_per_gpu,
            ("forward_micro_batch_size", "forward_micro_batch_size_per_gpu"), "critic",
            cfg.critic.forward_max_token_len_per_gpu,
        )
        _check_interleaved_training("critic", cfg.critic.ppo_mini_batch_size, critic_batch, critic_layout, rollout.n,
                                    critic_problems)
        # critic.ppo_mini_batch_size follows the actor's unless set: do not repeat the actor's error.
        p.errors += [e for e in critic_problems.errors if e.replace("critic.", f"{ARA}.actor.", 1) not in p.errors]
        p.notes += critic_problems.notes
    elif cfg.algorithm.adv_estimator == "gae":
        p.errors.append("algorithm.adv_estimator=gae needs values: remove critic.enable=false or pick grpo/rloo/...")
    reward = check_reward_model(cfg, ara.actor.megatron, actor.dp, p)
    if reward.model:  # the actor's layout (checked there) in the reward model's dtype
        reward = dataclasses.replace(reward, layout=_layout("reward_model.megatron", cfg.reward_model.megatron, world,
                                                            device, _Problems()))
    p.raise_if_any()
    derived = Derived(
        device=device, world_size=world, actor=actor, rollout=rollout, actor_batch=actor_batch,
        ref_forward_micro_batch_per_gpu=ref_micro, use_reference=use_reference, use_critic=use_critic,
        critic=critic_layout, critic_batch=critic_batch, algorithm=algorithm, placement=placement,
        notes=tuple(p.notes), reward=reward,
    )
    return RunConfig(cfg, derived)


def replace(cfg: Any, **changes: Any) -> Any:
    """A modified copy (for tests and presets): configs are frozen, so there is no in-place edit."""
    return dataclasses.replace(cfg, **changes)
