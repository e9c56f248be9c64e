#!/usr/bin/env bash
# One device lease as one orchestrator: it runs a plan file in its own session (it outlives the device calls), and
# each call only waits and brings back what it wrote under /tmp/L as one tar (DEVELOPERS.md, "A long lease").
#   benchmarks/lease.sh start PLAN SECONDS  -> copies PLAN, starts it with SECONDS of device time to use, returns
#   benchmarks/lease.sh poll SECONDS        -> waits up to SECONDS (less when the plan is done), then collect
#   benchmarks/lease.sh collect             -> logs and results under /tmp/L as $OUT/L.tgz (no weights, no checkpoints)
# A plan (benchmarks/leases/*.sh) is sourced by the orchestrator after the common inputs are ready; it calls the
# helpers below: log, left, phase_rows (one-GPU rows one after the other on a GPU, cut at a deadline),
# four_gpu (a four_gpu.py run if enough time is left), te_ready, row_if (a runs.py row if enough time is left),
# stop_leftovers, and touches nothing outside /tmp.
set -u
L=/tmp/L
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

collect() {
  mkdir -p "${OUT:-/tmp/out}"
  (cd /tmp && find L -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.md' -o -name '*.txt' \
     -o -name '*.rc' -o -name '*.sh' -o -name '*_at' \) -size -40M | tar czf "${OUT:-/tmp/out}/L.tgz" -T -)
  ls -la "${OUT:-/tmp/out}/L.tgz"
}

case "${1:-}" in
  start)
    mkdir -p $L && cp "$0" $L/lease.sh && cp "${2:?plan file}" $L/plan.sh
    echo $(( $(date +%s) + ${3:?seconds} )) > $L/end
    # The orchestrator runs from a copy of the tree: every device call copies the working tree again, and a run
    # that imported from it during a copy failed (No module named 'hybridrl.data.tokenizer', 4 x H200, 2026-11-28).
    T=/tmp/lease_tree; [ -e $T ] && mv $T $T.$(date +%s)
    mkdir -p $T && tar -C "$(dirname "$HERE")" --exclude=./.git --exclude=./.gpu --exclude=./.gpu_verl --exclude=./.venv \
      --exclude=__pycache__ -cf - . | tar -C $T -xf -
    (cd $T && setsid nohup bash benchmarks/lease.sh orchestrate > $L/orchestrator.log 2>&1 < /dev/null &)
    sleep 2; echo "tree copied to $T"; cat $L/orchestrator.log; exit 0 ;;
  poll)
    for _ in $(seq 1 "${2:?seconds}"); do [ -f $L/done ] && break; sleep 1; done
    tail -n 25 $L/lease.log; nvidia-smi --query-gpu=index,utilization.gpu,memory.used,clocks.sm,power.draw --format=csv,noheader
    collect; exit 0 ;;
  collect) collect; exit 0 ;;
  orchestrate) ;;
  *) echo "usage: lease.sh start PLAN SECONDS | poll SECONDS | collect"; exit 2 ;;
esac

T0=$(date +%s); END=$(cat $L/end)
log() { echo "[lease +$(( $(date +%s) - T0 ))s, $(( END - $(date +%s) ))s left] $*" | tee -a $L/lease.log; }
left() { echo $(( END - $(date +%s) )); }

phase_rows() {  # phase_rows GPU TAG DEADLINE ROW...: runs.py rows one after the other on GPU, each cut at DEADLINE
  local gpu=$1 tag=$2 deadline=$3; shift 3
  for row in "$@"; do
    local t=$(( deadline - $(date +%s) ))
    [ $t -lt 30 ] && { echo "$row skipped" >> $L/$tag.rc; continue; }
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 $t python3 benchmarks/runs.py --out $L/o_$tag run $row > $L/${tag}_$row.log 2>&1
    echo "$row $?" >> $L/$tag.rc
  done
}

four_gpu() {  # four_gpu MIN_SECONDS RUN [four_gpu.py args...]: on all the machine's GPUs, if MIN_SECONDS are left
  local need=$1 run=$2; shift 2
  [ $(left) -lt $need ] && { log "$run $* skipped: $(left)s left"; return; }
  log "$run $*"
  python3 benchmarks/four_gpu.py run $run --out $L/r --steps 5 --budget $(( $(left) - 30 )) "$@" \
    > $L/r_$run$(echo "$*" | tr -c 'a-z0-9' _ | cut -c1-24).log 2>&1
  log "$run rc $?"
}

te_ready() {  # wait for the transformer-engine build that a staging call's install.sh started
  bash benchmarks/te/install.sh /tmp/site --wait 240 > $L/te_wait.log 2>&1
  log "transformer-engine rc $?: $(tail -n 1 $L/te_wait.log)"
}

row_if() {  # row_if MIN_SECONDS OUT ROW [KNOB=V...]: one runs.py row if MIN_SECONDS are left, cut 15 s before the end
  local need=$1 out=$2 row=$3; shift 3
  [ "$(left)" -lt "$need" ] && { log "$row skipped: $(left)s left"; return; }
  log "$row $*"
  env "$@" timeout -k 10 $(( $(left) - 15 )) python3 benchmarks/runs.py --out "$out" run "$row" > $L/run_$row.log 2>&1
  log "$row rc $?: $(grep -h -E 'peak GPU memory|^== ' $L/run_$row.log | tail -n 3 | tr '\n' ' ')"
}

stop_leftovers() {  # what a cut phase left running, before the next phase takes the GPUs
  pkill -9 -f "python3 -m pytest|benchmarks/runs.py|main_ppo|main_sft|raylet|gcs_server|ray::" 2>/dev/null; sleep 3
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $L/gpu_procs_$(date +%s).txt
}

nvidia-smi > $L/nvidia_smi_start.txt; nvidia-smi topo -m > $L/topo.txt 2>&1
python3 benchmarks/multi_gpu_bench.py model --dir /tmp/m_7b --shape 7b --no-weights > $L/model_7b.log 2>&1
python3 -m zipfile -e /tmp/b/gguf-*.whl /tmp/site
mkdir -p /tmp/smol $L/r && cat /tmp/b/g_* > /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
log "inputs ready (7B model: see model_7b.log; smol $(stat -c %s /tmp/smol/*.gguf) bytes; GPU memory ${MEM_MIB} MiB)"
# shellcheck source=/dev/null
source $L/plan.sh
nvidia-smi > $L/nvidia_smi_end.txt
log "done"; touch $L/done
