"""How far verl 0.9.1's Megatron backend imports with megatron-core 0.16.1 + mbridge 0.15.1 (+ transformer-engine
where it is installed): one module at a time, in the order verl's worker loads them (--one-by-one: each in a fresh
process, so that one failure does not hide the next).

    PYTHONPATH=VERL_SITE:OUR_SITE python benchmarks/peer_verl/check_megatron_imports.py [--out FILE.json] [--build]
        [--one-by-one]

Prints one line per module (ok, or the exception and the frame that raised it) and the versions found. `--build`
goes one step further in-process: mbridge's AutoBridge reads a tiny Qwen2 config and builds megatron-core's
TransformerConfig (no model is built: that needs CUDA and transformer-engine's layers), then asks for the GPT layer
spec mbridge uses (transformer-engine's) and records where that stops.

On this CPU machine (2026-11-27, Python 3.11, torch 2.13 CPU, no transformer-engine) the answer is recorded in
README.md ("CPU checks"); `run.sh stage_megatron` runs the same on the GPU host with TE installed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

# verl's Megatron path, in load order: the engine registry imports .megatron inside try/except ImportError (a
# failure there only warns "megatron engine is not available" and the worker fails later with a KeyError), so each
# module is imported by name here to see the real error.
MODULES = [
    "megatron.core",
    "transformer_engine",
    "transformer_engine.pytorch",
    "mbridge",
    "verl.models.mcore.patch",
    "verl.models.mcore.mbridge",
    "verl.utils.megatron_utils",
    "verl.utils.megatron.optimizer",
    "verl.utils.checkpoint.megatron_checkpoint_manager",
    "verl.models.mcore.model_forward_fused",
    "verl.workers.engine.megatron.transformer_impl",
    "verl.workers.engine.megatron",
    "verl.workers.engine_workers",
    "verl.trainer.ppo.v1",
]

PROBE = r"""
import importlib, json, sys, traceback, warnings
warnings.simplefilter("ignore")
name = sys.argv[1]
try:
    importlib.import_module(name)
    print(json.dumps({"module": name, "ok": True}))
except BaseException as e:  # noqa: BLE001  (SystemExit from a library counts too)
    tb = traceback.extract_tb(e.__traceback__)
    last = tb[-1] if tb else None
    print(json.dumps({"module": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:600],
                      "at": f"{last.filename}:{last.lineno}" if last else None}))
"""


def probe(name: str, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"module": name, "ok": False, "error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"module": name, "ok": False, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}


def probe_here(name: str) -> dict:
    """The same probe in this process (modules load in verl's order, so a failure can leave later ones half-set)."""
    import importlib
    import traceback
    import warnings

    warnings.simplefilter("ignore")
    try:
        importlib.import_module(name)
        return {"module": name, "ok": True}
    except BaseException as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)
        return {"module": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:600],
                "at": f"{tb[-1].filename}:{tb[-1].lineno}" if tb else None}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for dist in ["torch", "megatron-core", "mbridge", "transformer-engine", "transformer_engine_torch", "verl",
                 "transformers", "vllm", "flash-attn", "apex"]:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def build_check() -> dict:
    """mbridge's config path for a tiny Qwen2 (what verl's vanilla_mbridge engine does before building)."""
    import tempfile
    import traceback
    import warnings

    warnings.simplefilter("ignore")
    result: dict = {}
    try:
        import torch
        from transformers import Qwen2Config

        folder = tempfile.mkdtemp()
        Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True).save_pretrained(folder)
        # mbridge reads the parallel sizes from megatron's state: one gloo process, tp = pp = 1
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu
        from transformers import AutoConfig

        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
        if not mpu.model_parallel_is_initialized():
            mpu.initialize_model_parallel()
        from verl.models.mcore.mbridge import AutoBridge

        bridge = AutoBridge.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
        # what settings.py passes through override_transformer_config (verl maps the string to AttnBackend)
        from megatron.core.transformer.enums import AttnBackend

        bridge.set_extra_args(attention_backend=AttnBackend.fused)
        cfg = bridge.config
        result["tf_config"] = {k: str(getattr(cfg, k, None)) for k in
                               ["num_layers", "hidden_size", "num_query_groups", "normalization", "gated_linear_unit",
                                "add_qkv_bias", "attention_backend", "bf16", "variable_seq_lengths"]}
        try:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

            get_gpt_decoder_block_spec(cfg, use_transformer_engine=True)
            result["te_layer_spec"] = "ok"
        except BaseException as e:  # noqa: BLE001
            tb = traceback.extract_tb(e.__traceback__)
            result["te_layer_spec"] = f"{type(e).__name__}: {e} (at {tb[-1].filename}:{tb[-1].lineno})"
    except BaseException as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)
        result["error"] = f"{type(e).__name__}: {e}"[:600] + (f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else "")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--one-by-one", action="store_true",
                    help="a fresh process per module (slow: each imports torch); default: one process, in order")
    args = ap.parse_args(argv)
    report = {"versions": versions(), "imports": []}
    print("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), flush=True)
    for name in MODULES:
        r = probe(name, args.timeout) if args.one_by_one else probe_here(name)
        report["imports"].append(r)
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {name}" + ("" if r["ok"] else f": {r['error']} [{r.get('at')}]"),
              flush=True)
    if args.build:
        report["build"] = build_check()
        print("build: " + json.dumps(report["build"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(r["ok"] for r in report["imports"] if r["module"] != "transformer_engine.pytorch") else 1


if __name__ == "__main__":
    sys.exit(main())
