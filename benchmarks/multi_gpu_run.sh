#!/usr/bin/env bash
# The old name of the two-GPU rows of benchmarks/runs.py (rows_two_gpu.py): `multi_gpu_run.sh stage|parity|report`
# runs the rows multi_stage, parity and multi_report, `multi_gpu_run.sh grpo NAME NGPUS [overrides]` the row
# multi_grpo; CPU=1 their dry runs on gloo. Knobs (MODEL, STEPS, GRPO_TIME_S) are read from the environment.
set -u
MODE=${1:?usage: multi_gpu_run.sh stage|parity|grpo NAME NGPUS [overrides]|report}
shift
case "$MODE" in
  stage|report|grpo) MODE=multi_$MODE ;;
esac
HOW=run; [ "${CPU:-0}" = 1 ] && HOW=dry
exec "${PY:-python3}" "$(dirname "$0")/runs.py" --out "${OUT:-/tmp/out}" "$HOW" "$MODE" "$@"
