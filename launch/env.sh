# Sourced by the launch scripts: the NCCL/gloo networking variables every process of a job sees.
#
# Set any of these before launching and they reach every rank (torchrun children, srun steps, Ray workers;
# the Ray runtime env also forwards NCCL_*/GLOO_* from the driver):
#   NCCL_SOCKET_IFNAME   interface(s) NCCL bootstraps over, e.g. "ib0" or "eth0" or "^lo,docker" (exclusions)
#   GLOO_SOCKET_IFNAME   interface gloo (CPU collectives, object exchange) uses; usually the same as NCCL's
#   NCCL_IB_DISABLE      1 to keep NCCL off InfiniBand/RoCE (TCP sockets only)
#   NCCL_NET_GDR_LEVEL   GPUDirect RDMA reach (e.g. PHB, SYS); leave unset for NCCL's choice
#   NCCL_NVLS_ENABLE     NVLink SHARP/multicast; 0 (off) by default here, see launch/README.md
#   NCCL_DEBUG           WARN by default; INFO prints the rings, transports and interfaces chosen
# shellcheck shell=bash

export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
for _hybridrl_var in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_NET_GDR_LEVEL NCCL_IB_HCA \
    NCCL_IB_GID_INDEX NCCL_CROSS_NIC TORCH_NCCL_ASYNC_ERROR_HANDLING; do
  if [[ -n "${!_hybridrl_var:-}" ]]; then
    export "${_hybridrl_var?}"
  fi
done
unset _hybridrl_var

# The networking variables that are set, as `NAME=value` words (for dry runs and logs).
hybridrl_net_env() {
  local v
  for v in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_NET_GDR_LEVEL NCCL_NVLS_ENABLE NCCL_IB_HCA \
      NCCL_IB_GID_INDEX NCCL_CROSS_NIC NCCL_DEBUG TORCH_NCCL_ASYNC_ERROR_HANDLING; do
    if [[ -n "${!v:-}" ]]; then
      printf '%s=%s\n' "$v" "${!v}"
    fi
  done
}

# Print a command (shell-quoted, one line) to stdout.
hybridrl_print_cmd() {
  local out="" w
  for w in "$@"; do
    out+="$(printf '%q' "$w") "
  done
  printf '%s\n' "${out% }"
}

# `ray start` flags only a head node takes: Ray (2.60, ray/scripts/scripts.py) aborts a worker node given one,
# "--include-dashboard should only be specified when starting head node with --head". RAY_START_ARGS is shared by
# the head and the workers, so these go to the head only.
HYBRIDRL_RAY_HEAD_ONLY_FLAGS=(--include-dashboard --redis-shard-ports)

# hybridrl_ray_start_args ROLE WORD...: sets the array hybridrl_start_args to the WORDs (RAY_START_ARGS split into
# words) that a `head` or `worker` node's `ray start` gets: a worker none of the head-only flags (--flag=value or
# --flag value), which go to hybridrl_head_only_args. Fails, naming the variable to set instead, on --port,
# --address and --head: the launch scripts set those themselves and the head's port must match RAY_ADDRESS.
hybridrl_ray_start_args() {
  local role="$1" value_of="" w flag
  shift
  hybridrl_start_args=()
  hybridrl_head_only_args=()
  for w in "$@"; do
    if [[ -n "$value_of" && "$w" != -* ]]; then  # the value of a head-only flag given as "--flag value"
      hybridrl_head_only_args+=("$w"); value_of=""; continue
    fi
    value_of=""
    flag="${w%%=*}"
    case "$flag" in
      --port) echo "RAY_START_ARGS must not hold $w: set RAY_PORT (the head's GCS port) instead" >&2; return 1 ;;
      --address) echo "RAY_START_ARGS must not hold $w: set RAY_ADDRESS (ray_start.sh worker) or HEAD_IP instead" >&2
                 return 1 ;;
      --head) echo "RAY_START_ARGS must not hold --head: the launch script picks each node's role" >&2; return 1 ;;
    esac
    if [[ "$role" == worker && " ${HYBRIDRL_RAY_HEAD_ONLY_FLAGS[*]} " == *" $flag "* ]]; then
      hybridrl_head_only_args+=("$w")
      [[ "$w" == *=* ]] || value_of="$flag"
      continue
    fi
    hybridrl_start_args+=("$w")
  done
}
