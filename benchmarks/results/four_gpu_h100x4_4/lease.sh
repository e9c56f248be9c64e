#!/usr/bin/env bash
# The 2026-11-28 lease on a 4-GPU machine, as it ran: one orchestrator started in its own session right after the
# unpack (it outlives the device calls; the calls only wait and bring back what it wrote under /tmp/L).
#   lease.sh start SECONDS   -> starts the orchestrator with SECONDS of device time to use, returns at once
#   lease.sh poll SECONDS    -> waits up to SECONDS (returns early when the orchestrator is done), then collect
#   lease.sh collect         -> the logs and results under /tmp/L as one tar in $OUT (weights and checkpoints left out)
# Phase A, in parallel: `pytest tests/gpu` as one command on GPUs 0-1 (issue 33), issue 41's agent_tools then issue
# 42's reward_model on GPU 3, issue 40's LoRA rows on GPU 2. Phase B, 4 GPUs, after A: the NCCL transport probes
# (multi_gpu_bench allgather: all-gather floor, pair p2p, two-peer p2p, CUDA IPC copy engine) under NCCL settings,
# then the cross-GPU sync rows (7b_big_rdp4, 7b_pp2dp2_rtp2) with the fastest two-peer setting, then the custom
# all-reduce A/B (7b_big_tp2dp2 plain and car) if both fit.
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
log "inputs ready (7B model rc: see model_7b.log; smol $(stat -c %s /tmp/smol/*.gguf) bytes)"

# ---------------------------------------------------------------- phase A (parallel, bounded by A_S)
A_S=$(( $(left) - 700 )); [ $A_S -gt 840 ] && A_S=840
log "phase A for at most ${A_S}s"
( CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 $A_S python3 -m pytest tests/gpu -v --durations=0 -o faulthandler_timeout=240 \
    -p no:cacheprovider > $L/tests_gpu.log 2>&1; echo $? > $L/tests_gpu.rc ) &
rows() {  # rows GPU TAG ROW...: one after the other on GPU, each cut at the end of phase A
  local gpu=$1 tag=$2; shift 2
  for row in "$@"; do
    local t=$(( A_END - $(date +%s) ))
    [ $t -lt 30 ] && { echo "$row skipped" >> $L/$tag.rc; continue; }
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 $t python3 benchmarks/runs.py --out $L/o_$tag run $row > $L/${tag}_$row.log 2>&1
    echo "$row $?" >> $L/$tag.rc
  done
}
A_END=$(( $(date +%s) + A_S ))
rows 2 i40 gpu_test_vllm_lora lora_7b_full lora_7b_lora &
rows 3 i41 agent_tools_traces agent_tools_sft agent_tools_grpo_tools agent_tools_grpo_no_tools reward_model &
wait
log "phase A done: tests/gpu rc $(cat $L/tests_gpu.rc 2>/dev/null); 40: $(tr '\n' ' ' < $L/i40.rc); 41/42: $(tr '\n' ' ' < $L/i41.rc)"
pkill -9 -f "python3 -m pytest|benchmarks/runs.py|main_ppo|main_sft|raylet|gcs_server|ray::" 2>/dev/null; sleep 3
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $L/gpu_procs_after_A.txt

# ---------------------------------------------------------------- phase B (4 GPUs)
probe() {  # probe NAME [VAR=VALUE ...]
  local name=$1; shift
  env "$@" timeout -k 5 100 python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
    benchmarks/multi_gpu_bench.py allgather --out $L/probe_$name.json $([ $name = default ] && echo --ipc) \
    > $L/probe_$name.log 2>&1
  log "probe $name ($*): rc $? $(grep -h 'pairs swapping\|all-gather over' $L/probe_$name.log | tr '\n' ' ')"
}
probe default
probe chunk2m NCCL_P2P_NVL_CHUNKSIZE=2097152
probe ch32 NCCL_MIN_P2P_NCHANNELS=32 NCCL_MIN_NCHANNELS=32
probe cemem NCCL_P2P_USE_CUDA_MEMCPY=1
BEST=$(python3 - <<'EOF'
import json, os
envs = {"default": "", "chunk2m": "NCCL_P2P_NVL_CHUNKSIZE=2097152",
        "ch32": "NCCL_MIN_P2P_NCHANNELS=32 NCCL_MIN_NCHANNELS=32", "cemem": "NCCL_P2P_USE_CUDA_MEMCPY=1"}
speed = {}
for k in envs:
    p = f"/tmp/L/probe_{k}.json"
    if os.path.exists(p):
        speed[k] = json.load(open(p)).get("p2p_two_peers_bytes_per_s", 0.0)
base = speed.get("default", 0.0)
best = max(speed, key=speed.get) if speed else "default"
print(envs[best] if speed.get(best, 0) > 1.15 * base else "")
EOF
)
log "two-peer p2p setting for the sync rows: '${BEST:-default}'"
mkdir -p $L/r && cp $L/probe_default.json $L/r/allgather_4.json 2>/dev/null
TAG=""; [ -n "$BEST" ] && TAG="--tag nccl"
for run in 7b_big_rdp4 7b_pp2dp2_rtp2; do
  [ $(left) -lt 260 ] && { log "$run skipped: $(left)s left"; continue; }
  log "$run ${BEST:-default NCCL}"
  env $BEST python3 benchmarks/four_gpu.py run $run --out $L/r --steps 5 --budget $(( $(left) - 40 )) $TAG > $L/r_$run.log 2>&1
  log "$run rc $?: $(tail -n 1 $L/r_$run.log)"
done
if [ $(left) -gt 420 ]; then
  log "custom all-reduce A/B"
  python3 benchmarks/four_gpu.py run 7b_big_tp2dp2 --out $L/r --steps 5 --budget 200 > $L/r_tp2dp2.log 2>&1
  python3 benchmarks/four_gpu.py run 7b_big_tp2dp2 --out $L/r --steps 5 --budget $(( $(left) - 40 )) --tag car \
    --override +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_custom_all_reduce=false > $L/r_tp2dp2_car.log 2>&1
  log "A/B done: $(tail -n 1 $L/r_tp2dp2.log) | $(tail -n 1 $L/r_tp2dp2_car.log)"
else
  log "custom all-reduce A/B skipped: $(left)s left"
fi
nvidia-smi > $L/nvidia_smi_end.txt
log "done"; touch $L/done
