#!/usr/bin/env bash
# Staging on the GPU host, and the old name of the run table's entry. `gpu_run.sh stage` unpacks the offline bundle
# carried to /tmp/b (DEVELOPERS.md), the gguf wheel and SmolLM2's file (/tmp/smol). Any other mode is a row of
# benchmarks/runs.py: `gpu_run.sh MODE ARGS` runs `python3 benchmarks/runs.py run MODE ARGS` (`scale SHAPE`: the row
# scale_SHAPE), CPU=1 its dry run; a row's knobs (GRPO_NAME, SHAPE, ...) are read from the environment as before.
set -u
MODE=${1:?usage: gpu_run.sh stage | MODE [ARGS] (the modes: python3 benchmarks/runs.py list)}
OUT=${OUT:-/tmp/out}
if [ "$MODE" = stage ]; then
  mkdir -p "$OUT"
  export PYTHONPATH=$PWD:/tmp/site
  bash /tmp/b/unpack.sh /tmp/site > "$OUT/unpack.log" 2>&1; echo "unpack rc=$?"
  python3 -m zipfile -e /tmp/b/gguf-*.whl /tmp/site
  mkdir -p /tmp/smol && cat /tmp/b/g_* > /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf && ls -la /tmp/smol
  nvidia-smi -L
  python3 -c "import torch, vllm, megatron.core, ray, gguf; print(torch.__version__, vllm.__version__, megatron.core.__version__, ray.__version__)"
  exit
fi
shift
[ "$MODE" = scale ] && { MODE=scale_${1:?usage: gpu_run.sh scale 0.5b|1.5b|3b|7b}; shift; }
HOW=run; [ "${CPU:-0}" = 1 ] && HOW=dry
exec "${PY:-python3}" "$(dirname "$0")/runs.py" --out "$OUT" "$HOW" "$MODE" "$@"
