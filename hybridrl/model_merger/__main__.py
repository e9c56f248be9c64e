"""`python -m hybridrl.model_merger merge --backend megatron --local_dir CKPT --target_dir OUT` (verl's CLI)."""
from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hybridrl.model_merger")
    sub = p.add_subparsers(dest="operation", required=True)
    merge = sub.add_parser("merge", help="write a training checkpoint as a HuggingFace folder")
    merge.add_argument("--backend", default="megatron", choices=["megatron"],
                       help="checkpoint format (hybridrl trains with megatron-core only)")
    merge.add_argument("--local_dir", required=True, help="role checkpoint, e.g. CKPT/global_step_10/actor")
    merge.add_argument("--target_dir", required=True, help="new folder for the HF model")
    merge.add_argument("--hf_model_path", default=None,
                       help="HF folder with config/tokenizer when the checkpoint has no huggingface/ folder")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from hybridrl.model_merger import megatron

    try:
        megatron.mcore_to_hf(args.local_dir, args.target_dir, hf_config_dir=args.hf_model_path)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError) as e:
        print(f"model_merger merge: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
