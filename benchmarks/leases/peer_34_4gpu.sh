# Issue 34 on four GPUs (peer_verl/README.md, "Lease 2"), sourced by benchmarks/lease.sh:
#   bash benchmarks/lease.sh start benchmarks/leases/peer_34_4gpu.sh SECONDS
# Needs, besides the usual staging: /tmp/bv holding .gpu_verl (an earlier call: `mkdir -p /tmp/bv && cp .gpu_verl/*
# /tmp/bv/`) and transformer-engine installed (benchmarks/te/install.sh /tmp/site). The 7B job with tp2 x dp2
# training and vLLM tp2 x dp2: hybridrl first (if verl's start-up takes the rest of the lease, the pair still has one
# side), then verl's Megatron backend, then verl's FSDP backend on the same 4 GPUs.
P=$L/peer
mkdir -p $P
te_ready
OUT=$P SKIP_1P5B=1 timeout 480 bash benchmarks/peer_verl/run.sh stage_megatron > $L/stage_megatron.log 2>&1
log "stage_megatron rc $?: $(grep -E '^(ok|FAIL)|engine check rc' $L/stage_megatron.log | tr '\n' ' ' | cut -c1-600)"

row_if 200 $P peer_ours_7b_4gpu CAP=300
row_if 300 $P peer_verl_megatron_7b_4gpu CAP=570
row_if 300 $P peer_verl_7b_4gpu CAP=570
python3 benchmarks/runs.py --out $P run peer_report_megatron > $L/report_megatron.log 2>&1
log "report rc $?"
