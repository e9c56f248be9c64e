#!/usr/bin/env bash
# Run hybridrl under torchrun with the local backend (same workers, one process per rank, no Ray). torchrun runs as
# `python -m hybridrl.torchrun`: on SIGTERM/SIGINT the ranks save the step in flight and the job ends with 128 + the
# signal, without torchrun's own traceback.
#
#   NPROC_PER_NODE=8 launch/torchrun.sh preset=7b_8gpu data.train_files=... actor_rollout_ref.model.path=...
#   # two nodes: run on each, NODE_RANK=0 on the node whose address is MASTER_ADDR
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NPROC_PER_NODE=8 launch/torchrun.sh preset=32b_16gpu ...
#
# Variables (all optional except MASTER_ADDR with NNODES > 1):
#   NPROC_PER_NODE  processes per node: GPUs, or worker processes on CPU (default: the GPUs nvidia-smi lists)
#   NNODES          nodes (default 1)        NODE_RANK    this node's rank, 0..NNODES-1 (default 0)
#   MASTER_ADDR     rank 0's node address    MASTER_PORT  rendezvous port (default 29500)
#   PYTHON          interpreter (default python)
#   ENTRY_MODULE    module to run (default hybridrl.trainer.main_ppo)
#   TORCHRUN_ARGS   extra torchrun arguments, word-split (e.g. "--log-dir logs --redirects 3")
#   HYBRIDRL_DRY_RUN=1  print the environment and the command instead of running it
# Arguments are passed to the entry module after trainer.backend/nnodes/n_gpus_per_node, so they can override them.
# NCCL/gloo variables: see launch/env.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/env.sh
source "$here/env.sh"

die() { echo "torchrun.sh: $*" >&2; exit 2; }

NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_PORT="${MASTER_PORT:-29500}"
PYTHON="${PYTHON:-python}"
ENTRY_MODULE="${ENTRY_MODULE:-hybridrl.trainer.main_ppo}"
if [[ -z "${NPROC_PER_NODE:-}" ]]; then
  NPROC_PER_NODE="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
  [[ "$NPROC_PER_NODE" -gt 0 ]] || die "no GPU found: set NPROC_PER_NODE (worker processes per node on CPU)"
fi
[[ "$NPROC_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "NPROC_PER_NODE=$NPROC_PER_NODE is not a positive integer"
[[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || die "NNODES=$NNODES is not a positive integer"
[[ "$NODE_RANK" =~ ^[0-9]+$ && "$NODE_RANK" -lt "$NNODES" ]] || die "NODE_RANK=$NODE_RANK must be in 0..$((NNODES - 1))"

if [[ "$NNODES" -eq 1 ]]; then
  rendezvous=(--standalone --nnodes=1)
else
  [[ -n "${MASTER_ADDR:-}" ]] || die "NNODES=$NNODES needs MASTER_ADDR (the address of the node with NODE_RANK=0)"
  rendezvous=(--nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT")
fi
extra=()
if [[ -n "${TORCHRUN_ARGS:-}" ]]; then
  read -r -a extra <<<"$TORCHRUN_ARGS"
fi

cmd=("$PYTHON" -m hybridrl.torchrun "${rendezvous[@]}" --nproc_per_node="$NPROC_PER_NODE" --max_restarts=0
     "${extra[@]}" -m "$ENTRY_MODULE"
     trainer.backend=local trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$NPROC_PER_NODE" "$@")

if [[ "${HYBRIDRL_DRY_RUN:-0}" == 1 ]]; then
  hybridrl_net_env
  hybridrl_print_cmd "${cmd[@]}"
  exit 0
fi
exec "${cmd[@]}"
