# Issue 34's one-GPU pairs on a machine of two GPUs (kind nvidia-h200-x2), one pair a GPU, then issue 33's tests/gpu
# in one command or issue 37's two-GPU rows with what is left. Sourced by benchmarks/lease.sh:
#   bash benchmarks/lease.sh start benchmarks/leases/peer_34_2gpu.sh SECONDS
# Needs, besides the usual staging: /tmp/bv holding .gpu_verl and transformer-engine building (peer_34_1gpu.sh).
# Each pair runs back to back on its own GPU (hybridrl first, then verl); the two GPUs run at the same time, so each
# side of a pair shares the host with the other GPU's run of the same trainer, roughly: the .md says so.
P=$L/peer
mkdir -p $P
te_ready
# verl's Megatron checks passed on an H200 on 2026-11-28 (stage_megatron.log of peer_verl_megatron_h200_1): the folders only
OUT=$P QUICK=1 SKIP_7B=1 timeout 400 bash benchmarks/peer_verl/run.sh stage_megatron > $L/stage_megatron.log 2>&1
log "stage rc $?: $(grep -E '^(== |smol)' $L/stage_megatron.log | tr '\n' ' ' | cut -c1-300)"

(
  export CUDA_VISIBLE_DEVICES=0
  row_if 200 $P peer_ours_best_1p5b CAP=300
  row_if 300 $P peer_verl_megatron_1p5b CAP=450
) > $L/lane0.out 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  row_if 150 $P peer_ours_best_smol STEPS=10 CAP=240
  row_if 300 $P peer_verl_megatron_smol STEPS=10 CAP=580
) > $L/lane1.out 2>&1 &
wait
stop_leftovers
python3 benchmarks/runs.py --out $P run peer_report_megatron > $L/report_megatron.log 2>&1
log "report rc $?: $(grep -h -E 'step_time_vs|parity' $L/report_megatron.log | head -n 4 | tr '\n' ' ')"

if [ "$(left)" -ge 760 ]; then  # 647 s on 2 x H200 (2026-11-28) with test_vllm_lora erroring at once, about 60 s more when it runs
  log "tests/gpu in one command"
  CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 $(( $(left) - 20 )) python3 -m pytest tests/gpu -v --durations=0 \
    -p no:cacheprovider > $L/tests_gpu.log 2>&1
  log "tests/gpu rc $?: $(tail -n 1 $L/tests_gpu.log)"
else
  for row in async_rl_colocated_2 async_rl_one_step_off_1_1 async_rl_fully_async_1_1; do row_if 200 $L/o2 $row; done
  python3 benchmarks/runs.py --out $L/o2 run async_rl_report_2gpu > $L/async_rl_report.log 2>&1
  log "async_rl report rc $?"
fi
