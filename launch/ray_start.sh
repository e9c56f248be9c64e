#!/usr/bin/env bash
# Submit a hybridrl job to a Ray cluster that is already running (`ray job submit`).
#
#   RAY_ADDRESS=http://127.0.0.1:8265 launch/ray_start.sh preset=32b_16gpu data.train_files=... ...
#
# The working directory is uploaded to the cluster WITHOUT weights, checkpoints, data files, virtualenvs and any
# file over 32 MB: the runtime env comes from hybridrl.controller.runtime_env.build_runtime_env (its excludes and
# the NCCL_*/GLOO_*/HF_* variables it forwards; names that look like credentials are never forwarded).
#
# Variables:
#   RAY_ADDRESS        the cluster's dashboard (job server) address, e.g. http://127.0.0.1:8265 (required). The
#                      dashboard listens on 127.0.0.1 by default: run this on the head node or through a tunnel,
#                      `ssh -N -L 8265:127.0.0.1:8265 HEAD`.
#   NNODES             trainer.nnodes (default 1)        GPUS_PER_NODE  trainer.n_gpus_per_node (default 8)
#   WORKING_DIR        directory to upload (default: the current directory)
#   RUNTIME_ENV_JSON   a runtime env (JSON) to use instead of building one
#   ENTRYPOINT         the job's command, word-split (default: "python -m hybridrl.trainer.main_ppo")
#   PYTHON             interpreter used here to build the runtime env (default python)
#   SUBMIT_ARGS        extra `ray job submit` arguments, word-split (e.g. "--no-wait --submission-id run7")
#   HYBRIDRL_DRY_RUN=1 print the runtime env and the command instead of submitting
# Arguments are passed to the entrypoint after trainer.backend/nnodes/n_gpus_per_node, so they can override them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/env.sh
source "$here/env.sh"

die() { echo "ray_start.sh: $*" >&2; exit 2; }

[[ -n "${RAY_ADDRESS:-}" ]] || die "set RAY_ADDRESS to the cluster's job server, e.g. http://127.0.0.1:8265"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
WORKING_DIR="${WORKING_DIR:-$PWD}"
PYTHON="${PYTHON:-python}"
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

cmd=(ray job submit --address="$RAY_ADDRESS" --runtime-env-json="$RUNTIME_ENV_JSON" "${submit_args[@]}" --
     "${entrypoint[@]}" trainer.backend=ray trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE" "$@")

if [[ "${HYBRIDRL_DRY_RUN:-0}" == 1 ]]; then
  hybridrl_net_env
  hybridrl_print_cmd "${cmd[@]}"
  exit 0
fi
exec "${cmd[@]}"
