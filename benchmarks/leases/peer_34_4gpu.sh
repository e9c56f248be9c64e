# Issue 34 on four GPUs (peer_verl/README.md, "Lease 2"), sourced by benchmarks/lease.sh:
#   bash benchmarks/lease.sh start benchmarks/leases/peer_34_4gpu.sh SECONDS
# Needs, besides the usual staging: /tmp/bv holding .gpu_verl (an earlier call: `mkdir -p /tmp/bv && cp .gpu_verl/*
# /tmp/bv/`) and transformer-engine installed (benchmarks/te/install.sh /tmp/site). The 7B job with tp2 x dp2
# training and vLLM tp2 x dp2: hybridrl first (if verl's start-up takes the rest of the lease, the pair still has one
# side), then verl's Megatron backend, then verl's FSDP backend on the same 4 GPUs.
P=$L/peer
mkdir -p $P
bash benchmarks/te/install.sh /tmp/site --wait 240 > $L/te_wait.log 2>&1
log "transformer-engine rc $?: $(tail -n 1 $L/te_wait.log)"
OUT=$P SKIP_1P5B=1 timeout 480 bash benchmarks/peer_verl/run.sh stage_megatron > $L/stage_megatron.log 2>&1
log "stage_megatron rc $?: $(grep -E '^(ok|FAIL)|engine check rc' $L/stage_megatron.log | tr '\n' ' ' | cut -c1-600)"

peer() {  # peer MIN_SECONDS ROW [KNOB=V...]: one peer_ROW of runs.py if MIN_SECONDS are left, cut before the end
  local need=$1 row=$2; shift 2
  [ "$(left)" -lt "$need" ] && { log "$row skipped: $(left)s left"; return; }
  log "$row $*"
  env "$@" timeout -k 10 $(( $(left) - 15 )) python3 benchmarks/runs.py --out $P run "peer_$row" > $L/peer_$row.log 2>&1
  log "$row rc $?: $(grep -h -E 'peak GPU memory|rc=' $L/peer_$row.log | tail -n 2 | tr '\n' ' ')"
}

peer 200 ours_7b_4gpu CAP=300
peer 300 verl_megatron_7b_4gpu CAP=570
peer 300 verl_7b_4gpu CAP=570
python3 benchmarks/runs.py --out $P run peer_report_megatron > $L/report_megatron.log 2>&1
log "report rc $?"
