#!/usr/bin/env bash
# Two-GPU runs of issue 8 (nvidia-h200-x2), one mode per device call (each must end inside 10 minutes);
# logs and results under $OUT. CPU=1 runs the same modes on gloo with a tiny model (the dry run).
#   stage            unpack the offline bundle (/tmp/b, DEVELOPERS.md) and build the random 1.5B model
#   parity           tp=2, pp=2, dp=2 against one GPU (log-probs, one update) + NCCL all-gather bandwidth
#   grpo NAME N ...  the real trainer (Ray controller, vLLM) on N GPUs with preset 1.5b_2gpu, extra overrides
#   report           benchmarks/multi_gpu_bench.py report -> $OUT/results/two_gpu.json
# Issue 8 in one lease (compare timings only within a lease; DEVELOPERS.md): stage, parity, then
#   grpo 1gpu 1
#   grpo 2gpu_dp 2                                   actor dp2 -> vLLM tp_g1 dp_g2 (no cross-GPU traffic)
#   grpo 2gpu_tp 2 $TP2 $RTP2                        actor tp2 -> vLLM tp_g2 (shard to shard, direct copy)
#   grpo 2gpu_tp_to_dp 2 $TP2 $RTP1                  actor tp2 -> vLLM tp_g1 dp_g2 (every rank gathers all)
# with TP2=actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 and
# RTP1/RTP2=actor_rollout_ref.rollout.tensor_model_parallel_size=1/2, then report.
# Split placement (issue 21), 1 training GPU + 1 rollout GPU, against grpo 2gpu_dp 2 of the same lease:
#   grpo split_sync 1 $SPLIT                         rollout on GPU 1, weights by NCCL broadcast, synchronous
#   grpo one_step_off 1 $SPLIT trainer.one_step_off_policy=true   generation of step k+1 during update k
# with SPLIT="actor_rollout_ref.hybrid_engine=false actor_rollout_ref.rollout.n_gpus_per_node=1
#   actor_rollout_ref.rollout.calculate_log_probs=true"; compare timing_s/step, async/staleness, weight_broadcast/*.
set -u
MODE=${1:?usage: multi_gpu_run.sh stage|parity|grpo NAME NGPUS [overrides]|report}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 \
       VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
MODEL=${MODEL:-/tmp/qwen2_1.5b}
STEPS=${STEPS:-5}
if [ "${CPU:-0}" = 1 ]; then
  SHAPE=tiny; DEV="--cpu"; ROLLOUT="actor_rollout_ref.rollout.name=torch trainer.device=cpu"; RESP=16
else
  SHAPE=1.5b; DEV=""; ROLLOUT="actor_rollout_ref.rollout.name=vllm trainer.device=cuda"
  RESP=256
fi

source "$(dirname "$0")/run_lib.sh"

case "$MODE" in
  stage)
    if [ "${CPU:-0}" != 1 ]; then
      bash /tmp/b/unpack.sh /tmp/site > "$OUT/unpack.log" 2>&1; echo "unpack rc=$?"
      nvidia-smi -L
    fi
    step model 300 $PY benchmarks/multi_gpu_bench.py model --dir "$MODEL" --shape $SHAPE
    ;;
  parity)
    B="benchmarks/multi_gpu_bench.py"; TR="$PY -m torch.distributed.run --standalone --nproc_per_node"
    step parity_1gpu 240 $TR=1 $B parity $DEV --dir "$MODEL" --out "$OUT/parity_tp1_pp1_dp1.json"
    step parity_tp2 240 $TR=2 $B parity $DEV --dir "$MODEL" --tp 2 --out "$OUT/parity_tp2_pp1_dp1.json"
    step parity_pp2 240 $TR=2 $B parity $DEV --dir "$MODEL" --pp 2 --out "$OUT/parity_tp1_pp2_dp1.json"
    step parity_dp2 240 $TR=2 $B parity $DEV --dir "$MODEL" --out "$OUT/parity_tp1_pp1_dp2.json"
    step allgather 120 $TR=2 $B allgather $DEV --out "$OUT/allgather.json"
    ;;
  grpo)
    NAME=${2:?grpo NAME NGPUS [overrides]}; N=${3:?grpo NAME NGPUS [overrides]}; shift 3
    RUN="$OUT/grpo_$NAME"; mkdir -p "$RUN"
    TP=1; for a in "$@"; do case $a in actor_rollout_ref.actor.megatron.tensor_model_parallel_size=*) TP=${a#*=};; esac; done
    RTP=1; for a in "$@"; do case $a in actor_rollout_ref.rollout.tensor_model_parallel_size=*) RTP=${a#*=};; esac; done
    echo "{\"gpus\": $N, \"actor_tp\": $TP, \"rollout_tp\": $RTP, \"preset\": \"1.5b_2gpu\"}" > "$RUN/run.json"
    # shellcheck disable=SC2086
    step "grpo_$NAME" 580 $PY -m hybridrl.trainer.main_ppo --config-name grpo_trainer preset=1.5b_2gpu \
      actor_rollout_ref.model.path="$MODEL" data.train_files="$MODEL/data/train.parquet" \
      data.val_files="$MODEL/data/test.parquet" data.max_prompt_length=64 data.max_response_length=$RESP \
      data.train_batch_size=32 actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.rollout.n=8 \
      actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.rollout.ignore_eos=true \
      actor_rollout_ref.rollout.gpu_memory_utilization=0.4 $ROLLOUT trainer.n_gpus_per_node="$N" \
      trainer.total_training_steps="$STEPS" trainer.test_freq=-1 trainer.save_freq=-1 trainer.val_before_train=false \
      trainer.logger="[console,jsonl]" trainer.progress_bar=false trainer.default_local_dir="$RUN" \
      trainer.max_time_s="${GRPO_TIME_S:-400}" "$@"
    ;;
  report)
    $PY benchmarks/multi_gpu_bench.py report --in-dir "$OUT" --out "$OUT/results/two_gpu.json" \
      --command "OUT=\$OUT bash benchmarks/multi_gpu_run.sh {stage,parity,grpo 1gpu 1,grpo 2gpu_dp 2,grpo 2gpu_tp 2 ...,grpo 2gpu_tp_to_dp 2 ...,report}" \
      | tail -n 60
    ;;
  *)
    echo "multi_gpu_run.sh: unknown mode '$MODE' (see the header of benchmarks/multi_gpu_run.sh for the modes)" >&2; exit 2
    ;;
esac
