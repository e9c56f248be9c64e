#!/usr/bin/env bash
# The 2026-11-28 (second) lease on a 4-GPU machine: one orchestrator started in its own session right after the
# unpack (it outlives the device calls; the calls only wait and bring back what it wrote under /tmp/L).
#   lease.sh start SECONDS   -> starts the orchestrator with SECONDS of device time to use, returns at once
#   lease.sh poll SECONDS    -> waits up to SECONDS (returns early when the orchestrator is done), then collect
#   lease.sh collect         -> the logs and results under /tmp/L as one tar in $OUT (weights and checkpoints left out)
# Phase A, in parallel: `pytest tests/gpu` as one command on GPUs 0-1 (issue 33); issue 40's LoRA rows on GPU 2
# (lora_7b_full only where the card holds it); issue 41's agent_tools stages then issue 42's reward_model on GPU 3;
# issue 35's sandbox red team on the host's CPU, as root and as nobody. Phase B, 4 GPUs: the all-gather floor, the
# cross-GPU sync rows with the zero-copy transport (7b_big_rdp4, 7b_pp2dp2_rtp2), the 1.5B dp4 pair with the engine
# kept awake (the KV wake of four processes at once), then rdp4 staged (the zero-copy A/B) if time is left.
set -u
L=/tmp/L
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

collect() {
  mkdir -p "${OUT:-/tmp/out}"
  (cd /tmp && find L -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.md' -o -name '*.txt' \
     -o -name '*.rc' -o -name '*.sh' \) -size -40M | tar czf "${OUT:-/tmp/out}/L.tgz" -T -)
  ls -la "${OUT:-/tmp/out}/L.tgz"
}

case "${1:-}" in
  start)
    mkdir -p $L && cp "$0" $L/lease.sh
    echo $(( $(date +%s) + ${2:?seconds} )) > $L/end
    setsid nohup bash "$0" orchestrate > $L/orchestrator.log 2>&1 < /dev/null &
    sleep 2; cat $L/orchestrator.log; exit 0 ;;
  poll)
    for _ in $(seq 1 "${2:?seconds}"); do [ -f $L/done ] && break; sleep 1; done
    tail -n 25 $L/lease.log; nvidia-smi --query-gpu=index,utilization.gpu,memory.used,clocks.sm,power.draw --format=csv,noheader
    collect; exit 0 ;;
  collect) collect; exit 0 ;;
  orchestrate) ;;
  *) echo "usage: lease.sh start S | poll S | collect"; exit 2 ;;
esac

T0=$(date +%s); END=$(cat $L/end)
log() { echo "[lease +$(( $(date +%s) - T0 ))s, $(( END - $(date +%s) ))s left] $*" | tee -a $L/lease.log; }
left() { echo $(( END - $(date +%s) )); }
nvidia-smi > $L/nvidia_smi_start.txt; nvidia-smi topo -m > $L/topo.txt 2>&1
python3 benchmarks/multi_gpu_bench.py model --dir /tmp/m_7b --shape 7b --no-weights > $L/model_7b.log 2>&1
python3 -m zipfile -e /tmp/b/gguf-*.whl /tmp/site
mkdir -p /tmp/smol && cat /tmp/b/g_* > /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
log "inputs ready (7B model: see model_7b.log; smol $(stat -c %s /tmp/smol/*.gguf) bytes; GPU memory ${MEM_MIB} MiB)"

# ---------------------------------------------------------------- phase A (parallel, bounded by A_S)
A_S=$(( $(left) - 720 )); [ $A_S -gt 780 ] && A_S=780
log "phase A for at most ${A_S}s"
A_END=$(( $(date +%s) + A_S ))
( CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 $A_S python3 -m pytest tests/gpu -v --durations=0 -o faulthandler_timeout=240 \
    -p no:cacheprovider > $L/tests_gpu.log 2>&1; echo $? > $L/tests_gpu.rc ) &
( # issue 35: the red team on this host (CPU only), as root, then as an unprivileged user where one can be made
  timeout 240 python3 -m pytest tests/unit/test_sandbox_redteam.py tests/unit/test_sandbox_capabilities.py -q \
    -p no:cacheprovider > $L/sandbox_root.log 2>&1; echo "root $?" >> $L/sandbox.rc
  chmod -R a+rX /tmp/site "$PWD" 2>/dev/null; chmod a+x /tmp 2>/dev/null
  timeout 240 setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp PYTHONPATH=$PYTHONPATH \
    python3 -m pytest tests/unit/test_sandbox_redteam.py tests/unit/test_sandbox_capabilities.py -q \
    -p no:cacheprovider > $L/sandbox_nobody.log 2>&1; echo "nobody $?" >> $L/sandbox.rc
  id nobody >> $L/sandbox.rc 2>&1; uname -r >> $L/sandbox.rc; whoami >> $L/sandbox.rc ) &
rows() {  # rows GPU TAG ROW...: one after the other on GPU, each cut at the end of phase A
  local gpu=$1 tag=$2; shift 2
  for row in "$@"; do
    local t=$(( A_END - $(date +%s) ))
    [ $t -lt 30 ] && { echo "$row skipped" >> $L/$tag.rc; continue; }
    if [ "$row" = lora_7b_full ] && [ "$MEM_MIB" -lt 120000 ]; then echo "$row skipped: ${MEM_MIB} MiB" >> $L/$tag.rc; continue; fi
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 $t python3 benchmarks/runs.py --out $L/o_$tag run $row > $L/${tag}_$row.log 2>&1
    echo "$row $?" >> $L/$tag.rc
  done
}
rows 2 i40 lora_7b_lora lora_7b_full &
rows 3 i41 agent_tools_traces agent_tools_sft agent_tools_grpo_tools agent_tools_grpo_no_tools reward_model &
wait
log "phase A done: tests/gpu rc $(cat $L/tests_gpu.rc 2>/dev/null); sandbox $(tr '\n' ' ' < $L/sandbox.rc); 40: $(tr '\n' ' ' < $L/i40.rc); 41/42: $(tr '\n' ' ' < $L/i41.rc)"
pkill -9 -f "python3 -m pytest|benchmarks/runs.py|main_ppo|main_sft|raylet|gcs_server|ray::" 2>/dev/null; sleep 3
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $L/gpu_procs_after_A.txt

# ---------------------------------------------------------------- phase B (4 GPUs)
mkdir -p $L/r
timeout -k 5 100 python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
  benchmarks/multi_gpu_bench.py allgather --out $L/r/allgather_4.json --ipc > $L/probe_default.log 2>&1
log "all-gather probe rc $?: $(grep -h 'pairs swapping\|all-gather over' $L/probe_default.log | tr '\n' ' ')"
b_run() {  # b_run MIN_SECONDS RUN [four_gpu.py args...]
  local need=$1 run=$2; shift 2
  [ $(left) -lt $need ] && { log "$run $* skipped: $(left)s left"; return; }
  log "$run $*"
  python3 benchmarks/four_gpu.py run $run --out $L/r --steps 5 --budget $(( $(left) - 30 )) "$@" > $L/r_$run$(echo "$*" | tr -c 'a-z0-9' _ | cut -c1-24).log 2>&1
  log "$run rc $?"
}
b_run 200 7b_big_rdp4
b_run 200 7b_pp2dp2_rtp2
b_run 330 1p5b_big_dp4 --tag keep --override actor_rollout_ref.rollout.free_cache_engine=false
b_run 180 1p5b_big_1gpu --tag keep --override actor_rollout_ref.rollout.free_cache_engine=false
b_run 200 7b_big_rdp4 --tag staged --override actor_rollout_ref.rollout.cross_gpu_zero_copy=false
nvidia-smi > $L/nvidia_smi_end.txt
log "done"; touch $L/done
