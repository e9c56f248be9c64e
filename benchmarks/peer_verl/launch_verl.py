"""verl 0.9.1's `python -m verl.trainer.main_ppo`, run unmodified after installing this benchmark's shims.

    python benchmarks/peer_verl/launch_verl.py OVERRIDES...

The shims folder goes first on PYTHONPATH so that processes started later (Ray workers inherit the driver's
environment through the local raylet; vLLM's engine processes inherit theirs) load them through sitecustomize.py.
Prints the versions verl runs with, so the log shows which transformers and vLLM it saw.
"""
import os
import runpy
import sys

SHIMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims")


def main() -> None:
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SHIMS]
    os.environ["PYTHONPATH"] = os.pathsep.join([SHIMS] + paths)
    sys.path.insert(0, SHIMS)
    import peer_verl_shims

    peer_verl_shims.install()
    import torch
    import transformers
    import verl

    try:
        from importlib.metadata import version
        vllm_version = version("vllm")
    except Exception:  # not installed (CPU checks)
        vllm_version = "absent"
    print(f"peer_verl: verl {verl.__version__} (from {os.path.dirname(verl.__file__)}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, vllm {vllm_version}, shims {sorted(peer_verl_shims.MOVED) or 'none'}",
          flush=True)
    sys.argv = ["verl.trainer.main_ppo"] + sys.argv[1:]
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
