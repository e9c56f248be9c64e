#!/usr/bin/env bash
# Stand-in job command: records its node, arguments and environment, then sleeps STANDIN_JOB_SECONDS and exits
# with STANDIN_JOB_EXIT.
set -euo pipefail
state="${STANDIN_STATE:?}"
echo "$$" >"$state/job.pid"
{
  echo "node=${SLURMD_NODENAME:-}"
  echo "RAY_ADDRESS=${RAY_ADDRESS:-}"
  echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-}"
  echo "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-}"
  printf 'arg=%s\n' "$@"
} >"$state/job.txt"
sleep "${STANDIN_JOB_SECONDS:-0}" &
sleeper=$!
trap 'kill "$sleeper" 2>/dev/null; exit 143' TERM INT
wait "$sleeper"
exit "${STANDIN_JOB_EXIT:-0}"
