# A short 4-GPU lease (~1,000 s after staging), sourced by benchmarks/lease.sh: tests/gpu as one command on GPUs
# 0-1 beside issue 40's and 41's one-GPU rows on GPUs 2 and 3, then the zero-copy A/B on all four.
te_ready
A_END=$(( $(date +%s) + $(left) - 380 ))
log "phase A until $(( A_END - $(date +%s) ))s from now"
( CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 $(( A_END - $(date +%s) )) python3 -m pytest tests/gpu -v --durations=0 \
    -o faulthandler_timeout=240 -p no:cacheprovider > $L/tests_gpu.log 2>&1; echo $? > $L/tests_gpu.rc ) &
phase_rows 2 i40 $A_END lora_7b_awake lora_smol &
phase_rows 3 i41 $A_END agent_tools_traces agent_tools_sft agent_tools_grpo_tools agent_tools_grpo_no_tools &
wait
log "phase A done: tests/gpu rc $(cat $L/tests_gpu.rc 2>/dev/null); 40: $(tr '\n' ' ' < $L/i40.rc); 41: $(tr '\n' ' ' < $L/i41.rc)"
stop_leftovers
four_gpu 170 7b_big_rdp4
four_gpu 170 7b_big_rdp4 --tag staged --override actor_rollout_ref.rollout.cross_gpu_zero_copy=false
