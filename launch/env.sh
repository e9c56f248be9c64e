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
