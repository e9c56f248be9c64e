#!/usr/bin/env bash
# Start the nodes of a Ray cluster, and run or submit a hybridrl job on it.
#
#   launch/ray_start.sh head                 # on the head node: `ray start --head`
#   RAY_ADDRESS=HEAD:6379 launch/ray_start.sh worker   # on every other node: `ray start --address`
#   RAY_ADDRESS=HEAD:6379 NNODES=2 GPUS_PER_NODE=8 launch/ray_start.sh run preset=32b_16gpu ...
#       # the job's driver here (on the head node), joining the cluster; nothing is uploaded
#   RAY_ADDRESS=http://HEAD:8265 NNODES=2 GPUS_PER_NODE=8 launch/ray_start.sh [submit] preset=32b_16gpu ...
#       # `ray job submit` through the dashboard's job server (needs ray[default] on the head)
#
# head / worker start this node's Ray (its raylet, and the GCS on the head) and return, or with RAY_BLOCK=1 stay in
# the foreground until the node is stopped (what a batch system's step or a container needs). Their variables:
#   RAY_PORT           the head's GCS port (default 6379)        RAY_ADDRESS  (worker) the head's HOST:PORT
#   NODE_IP            this node's address, --node-ip-address (default: Ray's pick)
#   NUM_GPUS           GPUs this node offers (default: what Ray detects)
#   NUM_CPUS           CPUs this node offers (default: what Ray detects); on a CPU cluster at least the
#                      trainer.n_gpus_per_node worker processes of a node (a node's CPUs are split among them)
#   RAY_TEMP_DIR       this node's session/log root, --temp-dir (default /tmp/ray); give two nodes on one host
#                      their own
#   RAY_BLOCK=1        stay in the foreground (`ray start --block`)
#   RAY_START_ARGS     extra `ray start` arguments, word-split (e.g. ports, so two nodes can share a host:
#                      "--min-worker-port=21000 --max-worker-port=21999 --dashboard-agent-listen-port=52366")
#   The head runs without the dashboard unless RAY_START_ARGS says --include-dashboard=true (submit needs it);
#   a worker leaves out such head-only flags (--include-dashboard, --redis-shard-ports), so that one RAY_START_ARGS
#   serves every node. --port: set RAY_PORT.
#
# The job is submitted (`ray job submit`) or run here (`run`) with the working directory's code; its variables:
#   RAY_ADDRESS        submit: the cluster's dashboard (job server) address, e.g. http://127.0.0.1:8265. The
#                      dashboard listens on 127.0.0.1 by default: run this on the head node or through a tunnel,
#                      `ssh -N -L 8265:127.0.0.1:8265 HEAD`. run: the GCS, HEAD:PORT.
#   NNODES             trainer.nnodes (default 1)        GPUS_PER_NODE  trainer.n_gpus_per_node (default 8)
#   WORKING_DIR        submit: directory to upload (default: the current directory)
#   RUNTIME_ENV_JSON   submit: a runtime env (JSON) to use instead of building one
#   ENTRYPOINT         the job's command, word-split (default: "python -m hybridrl.trainer.main_ppo"; run: $PYTHON)
#   PYTHON             interpreter used here (default python)
#   SUBMIT_ARGS        extra `ray job submit` arguments, word-split (e.g. "--no-wait --submission-id run7")
#   HYBRIDRL_DRY_RUN=1 print the environment and the command instead of running it
# The working directory is uploaded to the cluster WITHOUT weights, checkpoints, data files, virtualenvs and any
# file over 32 MB: the runtime env comes from hybridrl.controller.runtime_env.build_runtime_env (its excludes and
# the NCCL_*/GLOO_*/HF_* variables it forwards; names that look like credentials are never forwarded). `run`
# uploads nothing: every node needs the checkout and the environment at the same path.
# Arguments are passed to the entrypoint after trainer.backend/nnodes/n_gpus_per_node, so they can override them.
# A cluster with Ray's token authentication (RAY_AUTH_MODE=token) needs the same token on every node and in the
# job (RAY_AUTH_TOKEN_PATH, default ~/.ray/auth_token): set them when starting each node and the job.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/env.sh
source "$here/env.sh"

die() { echo "ray_start.sh: $*" >&2; exit 2; }

mode=submit
case "${1:-}" in
  head|worker|run|submit) mode="$1"; shift ;;
esac
PYTHON="${PYTHON:-python}"
RAY_BIN="${RAY_BIN:-ray}"

finish() {  # print (dry run) or run the command in "${cmd[@]}"
  if [[ "${HYBRIDRL_DRY_RUN:-0}" == 1 ]]; then
    hybridrl_net_env
    hybridrl_print_cmd "${cmd[@]}"
    exit 0
  fi
  exec "${cmd[@]}"
}

if [[ "$mode" == head || "$mode" == worker ]]; then
  [[ $# -eq 0 ]] || die "$mode takes no arguments (settings are variables), got: $*"
  read -r -a words <<<"${RAY_START_ARGS:-}"
  hybridrl_ray_start_args "$mode" "${words[@]}" || exit 2
  start_args=("${hybridrl_start_args[@]}")  # a worker's without the head-only flags (launch/env.sh)
  node=(--disable-usage-stats)
  [[ -z "${NODE_IP:-}" ]] || node+=(--node-ip-address="$NODE_IP")
  [[ -z "${NUM_GPUS:-}" ]] || node+=(--num-gpus="$NUM_GPUS")
  [[ -z "${NUM_CPUS:-}" ]] || node+=(--num-cpus="$NUM_CPUS")
  [[ -z "${RAY_TEMP_DIR:-}" ]] || node+=(--temp-dir="$RAY_TEMP_DIR")
  [[ "${RAY_BLOCK:-0}" != 1 ]] || node+=(--block)
  if [[ "$mode" == head ]]; then
    dashboard=(--include-dashboard=false)
    [[ " ${RAY_START_ARGS:-} " != *" --include-dashboard"* ]] || dashboard=()
    cmd=("$RAY_BIN" start --head --port="${RAY_PORT:-6379}" "${dashboard[@]}" "${node[@]}" "${start_args[@]}")
  else
    [[ -n "${RAY_ADDRESS:-}" ]] || die "set RAY_ADDRESS to the head's GCS address, HOST:PORT (e.g. 10.0.0.1:6379)"
    [[ "$RAY_ADDRESS" != *://* ]] || die "worker: RAY_ADDRESS=$RAY_ADDRESS must be the head's GCS HOST:PORT, not a URL"
    cmd=("$RAY_BIN" start --address="$RAY_ADDRESS" "${node[@]}" "${start_args[@]}")
  fi
  finish
fi

[[ -n "${RAY_ADDRESS:-}" ]] || die "set RAY_ADDRESS: the cluster's job server for submit (http://HEAD:8265), its GCS for run (HEAD:6379)"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
[[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || die "NNODES=$NNODES is not a positive integer"
[[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_NODE=$GPUS_PER_NODE is not a positive integer"
trainer_args=(trainer.backend=ray trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE")

if [[ "$mode" == run ]]; then
  [[ "$RAY_ADDRESS" != http*://* ]] || die "run: RAY_ADDRESS=$RAY_ADDRESS must be the GCS HOST:PORT (submit takes the job server's URL)"
  read -r -a entrypoint <<<"${ENTRYPOINT:-$PYTHON -m hybridrl.trainer.main_ppo}"
  export RAY_ADDRESS
  cmd=("${entrypoint[@]}" "${trainer_args[@]}" "$@")
  finish
fi

WORKING_DIR="${WORKING_DIR:-$PWD}"
read -r -a entrypoint <<<"${ENTRYPOINT:-python -m hybridrl.trainer.main_ppo}"
read -r -a submit_args <<<"${SUBMIT_ARGS:-}"
[[ -d "$WORKING_DIR" ]] || die "WORKING_DIR=$WORKING_DIR is not a directory"

if [[ -z "${RUNTIME_ENV_JSON:-}" ]]; then
  RUNTIME_ENV_JSON="$("$PYTHON" -c '
import json, sys
from hybridrl.controller.runtime_env import build_runtime_env
print(json.dumps(build_runtime_env(sys.argv[1])))
' "$WORKING_DIR")" || die "could not build the runtime env with $PYTHON (is hybridrl importable?); or set RUNTIME_ENV_JSON"
fi

cmd=("$RAY_BIN" job submit --address="$RAY_ADDRESS" --runtime-env-json="$RUNTIME_ENV_JSON" "${submit_args[@]}" --
     "${entrypoint[@]}" "${trainer_args[@]}" "$@")
finish
