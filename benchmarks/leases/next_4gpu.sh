# The next 4-GPU lease's plan (four_gpu.md, lease 7's "The next lease"), sourced by benchmarks/lease.sh:
#   bash benchmarks/lease.sh start benchmarks/leases/next_4gpu.sh SECONDS
# Phase B first (all four GPUs): the profile of the staged cross-GPU copy, which two leases could not fit (its
# steps other than step 3 are the local copies' overlap A/B against --tag serial); the bucket A/B (60 rounds
# against 15); pp2 -> tp_g2 on the staged default. Then phase A: tests/gpu as one command on GPUs 0-1 (about
# 12.5 minutes), issue 40's lora_smol alone on GPU 2, issue 41's run without the tool on GPU 3.
te_ready

# ---------------------------------------------------------------- phase B (4 GPUs)
timeout -k 5 100 python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
  benchmarks/multi_gpu_bench.py allgather --out $L/r/allgather_4.json > $L/probe_default.log 2>&1
log "all-gather probe rc $?: $(grep -h 'all-gather over' $L/probe_default.log | tr '\n' ' ')"
four_gpu 200 7b_big_rdp4 --tag prof --override global_profiler.tool=torch --override 'global_profiler.steps=[3]'
four_gpu 200 7b_big_rdp4 --tag serial --override actor_rollout_ref.rollout.cross_gpu_overlap_local=false
four_gpu 200 7b_big_rdp4 --tag b2g --override actor_rollout_ref.rollout.update_weights_bucket_megabytes=2048
four_gpu 200 7b_pp2dp2_rtp2
stop_leftovers

# ---------------------------------------------------------------- phase A (one GPU or two a row, in parallel)
A_END=$(( $(date +%s) + $(left) - 40 ))
log "phase A until $(( A_END - $(date +%s) ))s from now"
( CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 $(( A_END - $(date +%s) )) python3 -m pytest tests/gpu -v --durations=0 \
    -o faulthandler_timeout=240 -p no:cacheprovider > $L/tests_gpu.log 2>&1; echo $? > $L/tests_gpu.rc ) &
phase_rows 2 i40 $A_END lora_smol &
phase_rows 3 i41 $A_END agent_tools_traces agent_tools_sft agent_tools_grpo_no_tools &
wait
log "phase A done: tests/gpu rc $(cat $L/tests_gpu.rc 2>/dev/null); 40: $(tr '\n' ' ' < $L/i40.rc); 41: $(tr '\n' ' ' < $L/i41.rc)"
