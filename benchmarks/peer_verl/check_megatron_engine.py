"""verl 0.9.1's Megatron engine on one process: the same MegatronEngineWithLMHead verl's actor worker builds from
settings.py's verl_megatron overrides (composed through verl's Hydra config), then the weights it would send to
vLLM (get_per_tensor_param: mbridge's export_weights) against the checkpoint, and with --forward its log-prob pass
(infer_batch) against transformers on the same weights and one train_batch with verl's ppo_loss + KL loss.

    PYTHONPATH=VERL_SITE:OUR_SITE python benchmarks/peer_verl/check_megatron_engine.py --model TINY_QWEN2_DIR \
        [--device cpu|cuda] [--job 1p5b|7b] [--forward] [--out FILE.json]

--device cuda (run.sh stage_megatron, on the caller's first GPU): the real path, no stand-ins: nccl,
transformer-engine's layers, packed THD batches through TE's fused attention. Its FAIL line is the exact reason
when verl's Megatron backend cannot run on the host.
--device cpu (this machine): one gloo process, megatron-core made CPU-capable by hybridrl's adapters/megatron/
compat.py (loaded as a file: no hybridrl import), and these stand-ins for what needs CUDA: megatron-core's local
layer spec in mbridge's place (TE's needs CUDA) with its separate norms named for mbridge's loader, padded batches
(the local attention has no packed path) with verl's [batch, seq] mask made into the local attention's
[batch, 1, q, k] one, megatron's fused CUDA kernels off. What it still exercises of verl + mbridge 0.15.1 +
megatron-core 0.16.1: parallel-state init with verl's arguments, mbridge's TransformerConfig with verl's
overrides, mbridge's GPTModel build and DDP wrap, its HF weight load and export, verl's distributed optimizer,
scheduler, checkpoint manager, offloads, micro-batches by tokens, log-probs and its PPO update.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import settings  # noqa: E402


def _repo_file(name: str, *path: str):
    """A module of this repository loaded as a file (verl's site, not ours, is on the path: no hybridrl import)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, *path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compat():
    return _repo_file("peer_verl_mcore_compat", "adapters", "megatron", "compat.py")


def _dist_env() -> None:
    """One process's torch.distributed world, its rendezvous on a port free now (hybridrl/utils/net.py): a fixed
    port would collide with another run of this check, or any process holding it, on the same machine."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_repo_file("peer_verl_net", "hybridrl", "utils", "net.py").free_port("127.0.0.1"))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")


def run_cpu_stand_ins(done) -> None:
    """megatron-core on CPU (hybridrl's compat), and megatron-core's local layer spec in mbridge's place."""
    compat = _compat()
    compat.apply(force_cpu=True)
    compat.without_transformer_engine()
    _STATE["compat"] = compat
    import torch

    # verl logs GPU memory around its offloads (torch.cuda.memory_*): zeros on CPU
    for fn in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(torch.cuda, fn, lambda *a, **k: 0)
    torch.cuda.mem_get_info = lambda *a, **k: (0, 0)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    done("gloo process group, megatron-core on CPU (hybridrl compat)")

    # the local layer spec for mbridge
    import mbridge.core.llm_bridge as llm_bridge
    from megatron.core.models.gpt import gpt_layer_specs

    def local_spec(config, use_transformer_engine=True, **kw):  # noqa: ARG001  (TE's needs CUDA)
        return gpt_layer_specs.get_gpt_decoder_block_spec(config, use_transformer_engine=False, **kw)

    llm_bridge.get_gpt_decoder_block_spec = local_spec
    # ...and the local spec's separate norms named for mbridge's loader (TE fuses them into the next linear:
    # linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight); the HF names are mbridge's own
    from mbridge.models.qwen2 import Qwen2Bridge

    Qwen2Bridge._OTHER_MAPPING = {**getattr(Qwen2Bridge, "_OTHER_MAPPING", {}),
                                  "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]}
    Qwen2Bridge._MLP_MAPPING = {**Qwen2Bridge._MLP_MAPPING, "pre_mlp_layernorm.weight":
                                ["model.layers.{layer_number}.post_attention_layernorm.weight"]}


_STATE: dict = {}
engine_actor_config: list = []  # the actor's typed config (ppo_loss reads it), set by main


def forward_check(engine, model_dir: str, done, packed: bool = False) -> None:
    """verl's log-prob pass (engine.infer_batch, as TrainingWorker.infer_batch calls it) on a padded batch,
    against transformers' model on the same weights. Padded (BSHD) because megatron-core's local attention has no
    packed (THD) path; the GPU runs use THD through TE."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.utils.model import compute_position_id_with_mask
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    torch.manual_seed(1)
    batch, seqlen, resp = 4, 24, 12
    vocab = engine.model_config.hf_config.vocab_size
    input_ids = torch.randint(0, vocab, (batch, seqlen))
    attention_mask = torch.ones(batch, seqlen, dtype=torch.long)
    for i in range(batch):  # left padding in the prompt, right padding in the response
        attention_mask[i, : i] = 0
        attention_mask[i, seqlen - i:] = 0 if i else 1
    position_ids = compute_position_id_with_mask(attention_mask)
    data = DataProto.from_single_dict(
        {"input_ids": input_ids, "prompts": input_ids[:, :resp], "attention_mask": attention_mask,
         "position_ids": position_ids, "responses": input_ids[:, resp:], "response_mask": attention_mask[:, resp:]},
        meta_info={"temperature": 1.0, "global_token_num": attention_mask.sum(-1).tolist(), "compute_loss": False})
    td = left_right_2_no_padding(data.to_tensordict())
    engine.engine_config.use_remove_padding = packed
    tu.assign_non_tensor(td, use_remove_padding=packed, use_dynamic_bsz=True, max_token_len_per_gpu=64,
                         micro_batch_size_per_gpu=2, use_fused_kernels=False)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)
    logp = no_padding_2_padding(tu.get(out["model_output"] if "model_output" in out else out, "log_probs"), td).cpu()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = hf(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits.float()
    ref = torch.log_softmax(logits[:, resp - 1:-1], -1).gather(-1, input_ids[:, resp:, None])[..., 0]
    mask = attention_mask[:, resp:].bool()
    diff = (logp.float() - ref)[mask].abs()
    done(f"forward (verl infer_batch, {'packed THD' if packed else 'padded'}, dynamic bsz) vs transformers",
         tokens=int(mask.sum()),
         max_abs_logprob_diff=round(diff.max().item(), 4), mean_abs=round(diff.mean().item(), 5))
    if diff.mean().item() > 0.05:
        raise AssertionError(f"verl's megatron log-probs differ from transformers': mean {diff.mean().item()}")

    # one GRPO update through verl's train_batch with its ppo_loss (the settings' KL loss against a reference)
    from functools import partial

    from verl.workers.utils.losses import ppo_loss

    data = data.union(DataProto.from_single_dict({"old_log_probs": logp.float()}))
    data.batch["advantages"] = torch.randn(batch, seqlen - resp)
    data.batch["ref_log_prob"] = logp.float() - 0.01
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, use_remove_padding=packed, use_dynamic_bsz=True, max_token_len_per_gpu=64,
                         micro_batch_size_per_gpu=2, use_fused_kernels=False, global_batch_size=batch)
    before = {n: p.detach().float().clone() for n, p in engine.module[0].named_parameters()}
    with engine.train_mode():
        out = engine.train_batch(td, loss_function=partial(ppo_loss, config=engine_actor_config[0]))
    moved = sum(int(not torch.equal(before[n], p.detach().float())) for n, p in engine.module[0].named_parameters())
    metrics = out.get("metrics", {}) if isinstance(out, dict) else {}
    done("train step (verl train_batch + ppo_loss, KL loss)", params_moved=f"{moved}/{len(before)}",
         metrics=sorted(metrics)[:12])
    if moved == 0:
        raise AssertionError("the update moved no parameter")


def make_model(folder: str, tokenizer_dir: str) -> None:
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(tokenizer_dir):
        if name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy(os.path.join(tokenizer_dir, name), folder)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                      max_position_embeddings=1024)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--job", default="1p5b")
    ap.add_argument("--out", default=None)
    ap.add_argument("--forward", action="store_true", help="also verl's log-prob pass against transformers")
    ap.add_argument("--make-model", metavar="TOKENIZER_DIR", default=None,
                    help="first write --model: a 2-layer random Qwen2 with head_dim 128 (the real shapes' head size, "
                         "which TE's fused attention is known to take) and TOKENIZER_DIR's tokenizer")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the real path on one GPU (TE layers, packed THD batches, nccl), no stand-ins")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    _dist_env()
    steps: list[dict] = []
    stage = "setup"

    def done(name: str, **info) -> None:
        steps.append({"stage": name, "ok": True, **info})
        print(f"ok   {name}" + (f": {info}" if info else ""), flush=True)

    cpu = args.device == "cpu"
    if args.make_model:
        make_model(args.model, args.make_model)
    try:
        if cpu:
            run_cpu_stand_ins(done)
        else:
            import torch
            import torch.distributed as dist

            torch.cuda.set_device(0)
            dist.init_process_group("nccl", rank=0, world_size=1)
            done("nccl process group on GPU 0", device=torch.cuda.get_device_name(0))
        stage = "compose verl's config"
        import verl
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        overrides = settings.overrides("verl_megatron", args.job, os.path.abspath(args.model), "/tmp/peer_verl_cpu")
        if args.forward and cpu:  # megatron's fused CUDA kernels have no CPU path (hybridrl's builder turns them off too)
            overrides += [f"+actor_rollout_ref.actor.megatron.override_transformer_config.{k}=false" for k in
                          ("masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion",
                           "apply_rope_fusion", "persist_layer_norm", "gradient_accumulation_fusion")]
        with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                                   version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
        # the trainer writes the step count into the optimizer's config before building workers (trainer_base)
        cfg.actor_rollout_ref.actor.optim.total_training_steps = cfg.trainer.total_training_steps
        OmegaConf.resolve(cfg)
        done("compose", job=args.job)

        stage = "typed configs (as engine_workers.init_model)"
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        ara = cfg.actor_rollout_ref
        model_config = omega_conf_to_dataclass(ara.model, dataclass_type=HFModelConfig)
        actor = omega_conf_to_dataclass(ara.actor)
        actor.model_config = model_config
        engine_actor_config.append(actor)
        engine_config = actor.engine
        engine_config.use_dynamic_bsz = ara.actor.use_dynamic_bsz
        engine_config.infer_max_token_len_per_gpu = ara.rollout.log_prob_max_token_len_per_gpu
        engine_config.infer_micro_batch_size_per_gpu = ara.rollout.log_prob_micro_batch_size_per_gpu
        engine_config.max_token_len_per_gpu = ara.actor.ppo_max_token_len_per_gpu
        engine_config.micro_batch_size_per_gpu = ara.actor.ppo_micro_batch_size_per_gpu
        engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
        engine_config.use_fused_kernels = model_config.get("use_fused_kernels", False)
        model_config.model_type = "language_model"
        done("configs", engine=type(engine_config).__name__, optim=type(actor.optim).__name__)

        stage = "EngineRegistry.new (MegatronEngineWithLMHead.__init__: parallel state with verl's arguments)"
        from verl.workers.engine import EngineRegistry

        engine = EngineRegistry.new(model_type="language_model", backend=engine_config.strategy,
                                    model_config=model_config, engine_config=engine_config,
                                    optimizer_config=actor.optim, checkpoint_config=actor.checkpoint)
        if cpu:
            _STATE["compat"].install_memory_buffer()
            # verl's set_random_seed seeded megatron's CUDA RNG tracker; the CPU one gets the same seed
            _STATE["compat"].model_parallel_seed(engine_config.seed)
        done("engine constructed", cls=type(engine).__name__)

        stage = "engine.initialize (tf config, mbridge model + DDP, weight load, optimizer, checkpoint manager)"
        engine.initialize()
        n = sum(p.numel() for m in engine.module for p in m.parameters())
        done("engine.initialize", params=n, optimizer=type(engine.optimizer).__name__,
             attention_backend=str(getattr(engine.tf_config, "attention_backend", None)),
             variable_seq_lengths=getattr(engine.tf_config, "variable_seq_lengths", None),
             recompute=(getattr(engine.tf_config, "recompute_granularity", None),
                        getattr(engine.tf_config, "recompute_method", None),
                        getattr(engine.tf_config, "recompute_num_layers", None)),
             offload=(engine.is_param_offload_enabled, engine._is_offload_optimizer),
             fusions={k: getattr(engine.tf_config, k, None) for k in
                      ("masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion",
                       "gradient_accumulation_fusion")})

        stage = "get_per_tensor_param (the weights verl sends to vLLM: mbridge export_weights)"
        from safetensors.torch import load_file

        hf = {}
        for name in os.listdir(args.model):
            if name.endswith(".safetensors"):
                hf.update(load_file(os.path.join(args.model, name)))
        exported = {}
        per_tensor, _ = engine.get_per_tensor_param()
        for name, tensor in per_tensor:
            exported[name] = tensor.detach().float().cpu()
        tied = [n for n in hf if n not in exported]
        extra = sorted(set(exported) - set(hf))
        worst = max(((exported[n] - hf[n].float()).abs().max().item() /
                     max(hf[n].float().abs().max().item(), 1e-12), n) for n in exported if n in hf)
        # bf16 params against the fp32 checkpoint: a relative error within bf16's rounding (2^-8)
        done("export", tensors=len(exported), hf_tensors=len(hf), not_exported=tied, unknown=extra,
             worst_relative_error=round(worst[0], 6), worst_tensor=worst[1])
        if extra or worst[0] > 2 ** -8:
            raise AssertionError(f"exported weights differ from the checkpoint: unknown {extra}, worst {worst}")

        if args.forward and not cpu:
            stage = "forward (verl infer_batch, packed THD through TE) vs transformers, then one train_batch"
            forward_check(engine, args.model, done, packed=True)
        elif args.forward:
            stage = "forward (verl infer_batch, padded) vs transformers, then one train_batch"
            # verl moves each micro-batch TensorDict to get_device_id() (an int: CUDA); here the CPU
            import verl.workers.engine.megatron.transformer_impl as impl

            impl.get_device_id = lambda: "cpu"
            # verl's padded path hands the model a [batch, seq] validity mask (TE's attention takes it); megatron's
            # local attention wants [batch, 1, q, k] with True = masked: causal plus the padded keys
            from megatron.core.models.gpt.gpt_model import GPTModel

            if not getattr(GPTModel.forward, "_peer_verl_mask", False):
                forward = GPTModel.forward

                def forward_with_local_mask(self, input_ids, position_ids, attention_mask, *a, **k):
                    import torch

                    if attention_mask is not None and attention_mask.dim() == 2:
                        valid = attention_mask.bool()
                        n = valid.shape[1]
                        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
                        attention_mask = causal[None, None] | ~valid[:, None, None, :]
                    return forward(self, input_ids, position_ids, attention_mask, *a, **k)

                forward_with_local_mask._peer_verl_mask = True
                GPTModel.forward = forward_with_local_mask
            forward_check(engine, args.model, done)
    except BaseException as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)
        steps.append({"stage": stage, "ok": False, "error": f"{type(e).__name__}: {e}"[:1500],
                      "at": [f"{f.filename}:{f.lineno}" for f in tb[-4:]]})
        print(f"FAIL {stage}: {type(e).__name__}: {str(e)[:1200]}\n     at " + " <- ".join(
            f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(tb[-4:])), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(steps, f, indent=1, default=str)
    return 0 if all(s["ok"] for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
