"""`hybridrl convert hf-to-mcore | mcore-to-hf` (dispatched from hybridrl/__main__.py)."""
from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybridrl convert", description="HF <-> megatron-core checkpoint conversion (CPU)")
    sub = p.add_subparsers(dest="direction", required=True)
    h2m = sub.add_parser("hf-to-mcore", help="HF safetensors folder -> megatron dist checkpoint at a tp x pp layout")
    h2m.add_argument("--hf-dir", required=True, help="HuggingFace model folder (config.json + *.safetensors)")
    h2m.add_argument("--out", required=True, help="new folder for the checkpoint")
    h2m.add_argument("--tp", type=int, default=1, help="tensor-parallel size to save from")
    h2m.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to save from")
    h2m.add_argument("--ep", type=int, default=1, help="expert-parallel size to save from (MoE models)")
    h2m.add_argument("--etp", type=int, default=None, help="expert tensor-parallel size (MoE models; default: --tp)")
    h2m.add_argument("--timeout", type=float, default=3600.0, help="seconds before the worker processes are stopped")
    m2h = sub.add_parser("mcore-to-hf", help="hybridrl megatron checkpoint -> HF safetensors folder")
    m2h.add_argument("--ckpt-dir", required=True, help="a role checkpoint folder (meta.json, dist/, huggingface/)")
    m2h.add_argument("--out", required=True, help="new folder for the HF model")
    m2h.add_argument("--hf-config-dir", default=None, help="HF folder with config/tokenizer if the checkpoint lacks huggingface/")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from hybridrl.model_merger import megatron

    try:
        if args.direction == "hf-to-mcore":
            megatron.hf_to_mcore(args.hf_dir, args.out, args.tp, args.pp, timeout_s=args.timeout, ep=args.ep,
                                 etp=args.etp)
        else:
            megatron.mcore_to_hf(args.ckpt_dir, args.out, hf_config_dir=args.hf_config_dir)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, TimeoutError) as e:
        print(f"hybridrl convert {args.direction}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
