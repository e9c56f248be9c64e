# Issue 34 on one GPU (peer_verl/README.md, "Lease 1"), sourced by benchmarks/lease.sh:
#   bash benchmarks/lease.sh start benchmarks/leases/peer_34_1gpu.sh SECONDS
# Needs, besides the usual staging: /tmp/bv holding .gpu_verl (an earlier call: `mkdir -p /tmp/bv && cp .gpu_verl/*
# /tmp/bv/`) and transformer-engine building (benchmarks/te/install.sh /tmp/site). verl's Megatron backend on the
# 1.5B and SmolLM2 jobs, hybridrl's best settings beside each, one run at a time on GPU 0; hybridrl's spread on
# SmolLM2 (other data orders) with what time is left.
P=$L/peer
mkdir -p $P
te_ready
OUT=$P SKIP_7B=1 timeout 480 bash benchmarks/peer_verl/run.sh stage_megatron > $L/stage_megatron.log 2>&1
log "stage_megatron rc $?: $(grep -E '^(ok|FAIL)|engine check rc' $L/stage_megatron.log | tr '\n' ' ' | cut -c1-600)"

# hybridrl first on each job: if verl's start-up takes the rest of the lease, the pair still has one side
row_if 200 $P peer_ours_best_1p5b CAP=300
row_if 300 $P peer_verl_megatron_1p5b CAP=570
row_if 150 $P peer_ours_best_smol STEPS=10 CAP=240
row_if 300 $P peer_verl_megatron_smol STEPS=10 CAP=580
python3 benchmarks/runs.py --out $P run peer_report_megatron > $L/report_megatron.log 2>&1
log "report rc $?"
row_if 150 $P peer_ours_best_smol_seed STEPS=10 CAP=240 SEED=2
row_if 150 $P peer_ours_best_smol_seed STEPS=10 CAP=240 SEED=3
python3 benchmarks/runs.py --out $P run peer_report_megatron > $L/report_megatron.log 2>&1
log "report rc $?"
