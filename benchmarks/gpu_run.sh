#!/usr/bin/env bash
# GPU host runs, one mode per device call (each must end inside 10 minutes); logs and results go under $OUT.
# Every vLLM engine runs with CUDA graphs (vLLM's default) unless a run says eager.
#   stage:  bash /tmp/b/unpack.sh /tmp/site (the offline bundle, DEVELOPERS.md) + the gguf wheel + the SmolLM2 file
#   checks: tests/gpu (controller NCCL, megatron-core bf16, vLLM hybrid engine) + benchmarks/train_bench.py
#   bench:  benchmarks/hybrid_bench.py (rollout alternated with standalone vLLM peers, the 0.5B gap table, the
#           follow check, reshard, plan vs measured)
#   gap:    benchmarks/gap_bench.py on the random 1.5B model and on SmolLM2-135M (each engine vs float32)
#   grpo:   GRPO on SmolLM2-135M-Instruct + gsm_symbolic for GRPO_TIME_S seconds into $OUT/grpo_$GRPO_NAME
#           (GRPO_ARGS: extra overrides), then grpo_report.py
#   te:     tests/gpu/test_megatron_te.py + test_megatron_gpu.py (transformer-engine installed: its spec is the default)
#   speed:  train_bench on SHAPE (1.5b) with a GSM8K-like length spread: local vs TE, padded vs packed (same lease)
#   speed7b: train_bench on the 7B shape, TE + packed + recompute, the optimizer state on the host until its step
#           (as in the hybrid engine: 137 GB at the step, ~80 GB in the forward/backward); train_mfu_7b is the
#           forward+backward's MFU; SPEED_ARGS adds options
#   speed7bcmp: the 7B shape's te_vs_local and packed_vs_padded (local padded, TE padded, TE packed; recompute,
#           TOKENS-token micro-batches, 8192)
#   agent:  tests/gpu/test_agent_vllm.py, then agent_bench.py on SmolLM2-135M (multi-turn with the calculator vs
#           single-turn, same engine and prompts) -> results/agent_loop.json
#   agentgrpo: AGENT_TIME_S seconds of GRPO with configs/agent_smollm2_calc.yaml (the agent loop inside the hybrid
#           worker) into $OUT/agent_grpo
#   report: rollout_graphs_report.py over the runs above (graphs, warm, eager) -> results/rollout_graphs.json
#   moe:    issue 20 in one call (~9 min): the random Qwen3-MoE moe_1b model (1.28B total, 0.49B active, 32 experts,
#           top-4) + arithmetic data, GRPO through the real trainer with routing recorded (router replay off, then
#           R3), gap_bench on the same model (bf16 floor), moe_report.py -> results/moe_grpo.json + .md.
#           MOE_STEPS (4) steps a run, MOE_ARGS: extra trainer overrides for both runs
#   moetest: tests/gpu/test_vllm_moe.py (tiny Qwen3-MoE: sync, follow, routing agreement, R3)
#   scale SHAPE: issue 19's scale curve, one Qwen2.5 shape (0.5b|1.5b|3b|7b, random weights) per call: builds
#           /tmp/m_SHAPE if missing (multi_gpu_bench.py model: weights + the demo's arithmetic data), writes
#           `hybridrl plan --json` for the exact trainer overrides, runs GRPO through the real trainer on 1 GPU
#           (vLLM, CUDA graphs) for STEPS (4) steps into $OUT/scale_SHAPE (trainer.max_time_s=SCALE_TIME_S, 150 s
#           of training, as a guard; the whole call stops at SCALE_BUDGET_S, 570 s), then scale_report.py over every
#           $OUT/scale_* so far -> results/megatron_scale.json + .md (+ results/megatron_scale/ per-shape files).
#           The workload is the same for every shape (scale_common); only memory knobs differ (scale_shape_args,
#           the table the report prints). SCALE_ARGS: extra trainer overrides. CPU=1 PY=.venv/bin/python: the dry
#           run of the same row on the tiny model (torch engine, trainer.device=cpu, 4x4 samples of 16 tokens, 3 steps)
#   scalemodel SHAPE...: only build /tmp/m_SHAPE for each shape (e.g. 7b beside `stage`, to keep `scale 7b` short)
# Issue 19's runs of 2026-11-26 (megatron_speed.md), one H200 lease with needs_h200 (the 1.5B runs fit an H100),
# calls back to back (the machine goes cold after about 30 s idle), with R=$OUT of the device call and OUT=/tmp/res:
#   1. the 5 bundle carries (p_0..p_4 + zs, and .gpu/m_7b), unpack in the last                 ~1 min
#   2. the six .gpu/te parts one per call into /tmp/b/te, `bash benchmarks/te/install.sh /tmp/site` (prebuilt)
#   3. `SHAPE=1.5b SPEED_ARGS="--dynamic-tokens 6144" speed` (local, TE, TE packed, FP8 delayed + tensorwise) ~3 min
#   4. `speed7b` (no recompute, 8192-token micro-batches, profiled; recompute 16384)                   ~2.3 min
#   5. `speed7bcmp` (local padded, TE padded, TE packed; recompute, 8192)                               ~3 min
# The scale curve (`scale SHAPE`, one shape a call, 7b first: ~3.5 min, the others ~2 min) is done on this code.
set -u
MODE=${1:?usage: gpu_run.sh stage|checks|bench|gap|grpo|agent|agentgrpo|report|te|speed|speed7b|speed7bcmp|moe|moetest|scale SHAPE|scalemodel SHAPE...}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 \
       VLLM_ENABLE_V1_MULTIPROCESSING=0 HYBRIDRL_MODEL_CACHE=/tmp/mcache TOKENIZERS_PARALLELISM=false
SMOL=/tmp/smol
PY=${PY:-python3}  # the scale modes only (CPU=1 dry run: PY=.venv/bin/python)

STEP_TAIL=8
source "$(dirname "$0")/run_lib.sh"

# The scale curve's per-shape trainer overrides on one H200 (139.8 GiB as torch counts it): memory knobs only, checked
# with `hybridrl plan` (its numbers for each row are in the run folder's plan.json). All rows pack sequences and cut
# micro-batches by tokens (scale_common); the budget shrinks with the model's state. 7b: 7.6B params x (2 bf16
# params + 4 fp32 grads + 12 Adam/fp32 master) = 137 GB is only on the GPU for the optimizer step (actor_step,
# 130.7 GiB with the overhead): with optimizer_offload=true the hybrid engine keeps the optimizer state on the host
# from the rollout until the update's first optimizer step (weight_sync.py, step 9), so the log-prob passes and the
# forward/backward run without it; layers are recomputed. Keep the grads in fp32: bf16 grads (grad_reduce_in_fp32=false) save 15 GB in
# the backward but the distributed optimizer copies them to fp32 for the step (+30 GB: OOM on 2026-11-25,
# benchmarks/results/adam_mem.md). The reference is off (use_kl_loss=false) for the host's sake: the optimizer state
# pins 91 GB of its 125 GiB, and megatron's CPU optimizer offload ran the host out of memory (megatron_scale.md).
# On an 80 GB card (H100) the 3b row needs more (plan: no fit; it ran OOM on 2026-11-25):
# SCALE_ARGS="actor_rollout_ref.model.enable_gradient_checkpointing=true
# +actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32=false actor_rollout_ref.ref.megatron.param_offload=true
# actor_rollout_ref.actor.megatron.{optimizer,grad,param}_offload=true" (each written out) ran there.
scale_shape_args() {
  case $1 in
    0.5b) echo "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384" ;;
    1.5b) echo "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192" ;;
    3b)   echo "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192" ;;
    7b)   echo "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 actor_rollout_ref.model.enable_gradient_checkpointing=true \
actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.load_weight=false \
actor_rollout_ref.actor.megatron.optimizer_offload=true" ;;
    *) return 1 ;;
  esac
}
scale_common() {  # scale_common MODEL_DIR RUN_DIR: the workload, the same for every shape
  local m=$1 run=$2 prompts=16 n=8 resp=256 dev="actor_rollout_ref.rollout.name=vllm trainer.device=cuda"
  [ "${CPU:-0}" = 1 ] && { prompts=4; n=4; resp=16; dev="actor_rollout_ref.rollout.name=torch trainer.device=cpu"; }
  echo "--config-name grpo_trainer actor_rollout_ref.model.path=$m data.train_files=$m/data/train.parquet \
data.val_files=$m/data/test.parquet data.max_prompt_length=64 data.max_response_length=$resp \
data.train_batch_size=$prompts actor_rollout_ref.actor.ppo_mini_batch_size=$prompts actor_rollout_ref.rollout.n=$n \
actor_rollout_ref.rollout.ignore_eos=true actor_rollout_ref.model.use_remove_padding=true \
actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.n_gpus_per_node=1 $dev \
trainer.total_training_steps=${STEPS:-$([ "${CPU:-0}" = 1 ] && echo 3 || echo 4)} \
trainer.max_time_s=${SCALE_TIME_S:-150} trainer.test_freq=-1 trainer.save_freq=-1 trainer.val_before_train=false \
trainer.logger=[console,jsonl] trainer.progress_bar=false trainer.default_local_dir=$run"
}
scale_model() {  # scale_model SHAPE: /tmp/m_SHAPE (the tiny model on CPU), built when missing; prints its path
  local shape=$1; [ "${CPU:-0}" = 1 ] && shape=tiny
  local m=${SCALE_MODELS:-/tmp}/m_$shape
  # 7b starts from random weights in megatron and placeholders in vLLM (its row's load_weight=false): no 15 GB file
  [ -f "$m/config.json" ] || step "model_$shape" 300 $PY benchmarks/multi_gpu_bench.py model --dir "$m" --shape $shape \
    $([ "$shape" = 7b ] && echo --no-weights) >&2
  echo "$m"
}

case "$MODE" in
  stage)
    bash /tmp/b/unpack.sh /tmp/site > "$OUT/unpack.log" 2>&1; echo "unpack rc=$?"
    python3 -m zipfile -e /tmp/b/gguf-*.whl /tmp/site
    mkdir -p $SMOL && cat /tmp/b/g_* > $SMOL/SmolLM2-135M-Instruct.Q4_1.gguf && ls -la $SMOL
    nvidia-smi -L
    python3 -c "import torch, vllm, megatron.core, ray, gguf; print(torch.__version__, vllm.__version__, megatron.core.__version__, ray.__version__)"
    ;;
  checks)
    step test_controller_gpu 150 python3 -m pytest -q -x tests/gpu/test_controller_gpu.py
    step test_megatron_gpu 200 python3 -m pytest -q -x -s tests/gpu/test_megatron_gpu.py
    step test_vllm_hybrid 200 python3 -m pytest -q -x -s tests/gpu/test_vllm_hybrid.py
    step train_bench_local 150 python3 benchmarks/train_bench.py --attention-backend local --out "$OUT/train_bench_local.json"
    step train_bench 150 python3 benchmarks/train_bench.py --peer "$OUT/train_bench_local.json" \
      --out "$OUT/results/train_bench.json"
    ;;
  bench)
    step hybrid_bench 570 python3 benchmarks/hybrid_bench.py --out-dir "$OUT/results"
    grep -E "^(rep |peer |gap |follow )" "$OUT/hybrid_bench.log"
    ;;
  gap)
    M=${MODEL:-/tmp/qwen2_1.5b}
    [ -f "$M/config.json" ] || step model 200 python3 benchmarks/multi_gpu_bench.py model --dir "$M" --shape 1.5b
    step gap_bench 280 python3 benchmarks/gap_bench.py --model-dir "$M" --out "$OUT/results/gap_bench.json"
    grep -E "_vs_" "$OUT/gap_bench.log"
    S=$(smol_dir)
    step gap_bench_smollm2 240 python3 benchmarks/gap_bench.py --model-dir "$S" --out "$OUT/results/gap_bench_smollm2.json"
    grep -E "_vs_" "$OUT/gap_bench_smollm2.log"
    ;;
  grpo)
    T=${GRPO_TIME_S:-420}; N=${GRPO_NAME:-graphs}
    CMD="python3 -m hybridrl.trainer.main_ppo --config-name grpo_smollm2_gsm8k actor_rollout_ref.model.path=$SMOL \
trainer.default_local_dir=$OUT/grpo_$N trainer.max_time_s=$T ${GRPO_ARGS:-}"
    step grpo_$N 590 $CMD
    grep -h "start-up" "$OUT/grpo_$N.log"
    python3 benchmarks/grpo_report.py --metrics "$OUT/grpo_$N/logs/metrics.jsonl" --command "$CMD" \
      --out "$OUT/results/grpo_$N.json" > "$OUT/grpo_report_$N.log" 2>&1; tail -n 40 "$OUT/grpo_report_$N.log"
    ;;
  agent)
    step test_agent_vllm 200 python3 -m pytest -q -x -s tests/gpu/test_agent_vllm.py
    S=$(smol_dir)
    step agent_bench 240 python3 benchmarks/agent_bench.py --model-dir "$S" --out "$OUT/results/agent_loop.json"
    ;;
  agentgrpo)
    CMD="python3 -m hybridrl.trainer.main_ppo --config-name agent_smollm2_calc actor_rollout_ref.model.path=$SMOL \
trainer.default_local_dir=$OUT/agent_grpo trainer.max_time_s=${AGENT_TIME_S:-150} ${AGENT_ARGS:-}"
    step agent_grpo 280 $CMD
    grep -h "agent/\|val/score" "$OUT/agent_grpo.log" | tail -n 12
    ;;
  report)
    python3 benchmarks/rollout_graphs_report.py --bench "$OUT/results" --graphs "$OUT/grpo_graphs/logs/metrics.jsonl" \
      --warm "$OUT/grpo_warm/logs/metrics.jsonl" --eager "$OUT/grpo_eager/logs/metrics.jsonl" \
      --gap 1.5b_random="$OUT/results/gap_bench.json" --gap smollm2_135m="$OUT/results/gap_bench_smollm2.json" \
      --out "$OUT/results/rollout_graphs.json"
    ;;
  te)
    step test_megatron_te 400 python3 -m pytest -q -x -s tests/gpu/test_megatron_te.py
    step test_megatron_gpu 180 python3 -m pytest -q -x -s tests/gpu/test_megatron_gpu.py
    grep -h "^\[te\|^\[fp8\|^\[megatron gpu\]" "$OUT"/test_megatron_*.log
    ;;
  speed)
    S=${SHAPE:-1.5b}; M=/tmp/m_$S
    [ -f "$M/config.json" ] || step model 240 python3 benchmarks/multi_gpu_bench.py model --dir "$M" --shape "$S"
    A="--model-dir $M --shape $S --lengths gsm8k --samples ${SAMPLES:-64} --micro ${MICRO:-4} --skip-offload ${SPEED_ARGS:-}"
    step speed_local 150 python3 benchmarks/train_bench.py $A --transformer-impl local --out "$OUT/speed_${S}_local.json"
    step speed_te 150 python3 benchmarks/train_bench.py $A --transformer-impl transformer_engine \
      --peer "$OUT/speed_${S}_local.json" --out "$OUT/results/speed_${S}_te.json"
    # TE runs with its fused THD RoPE (builder.py's default since 2026-11-26: 1.25x on this run, megatron_speed.md);
    # the profile (PROFILE rows, after the result is written: it does not touch the metrics) says where the MFU goes
    step speed_te_packed 150 python3 benchmarks/train_bench.py $A --transformer-impl transformer_engine --packed \
      --profile "${PROFILE:-20}" --peer "$OUT/results/speed_${S}_te.json" --out "$OUT/results/speed_${S}_te_packed.json"
    # FP8 (issue 19 asks for its speed-up): the packed TE run again with each scaling recipe, against bf16 packed
    for R in ${FP8_RECIPES:-tensorwise delayed}; do
      step "speed_te_packed_fp8_$R" 150 python3 benchmarks/train_bench.py $A --transformer-impl transformer_engine --packed \
        --fp8 e4m3 --fp8-recipe "$R" --peer "$OUT/results/speed_${S}_te_packed.json" \
        --out "$OUT/results/speed_${S}_te_packed_fp8_$R.json"
    done
    grep -h "_vs_\|train_mfu" "$OUT/results/speed_${S}"_*.json
    ;;
  speed7b)
    M=$(scale_model 7b)  # config only: random init
    # the fastest fit (hybridrl plan: 91 GiB in the forward/backward): 8192-token micro-batches, nothing recomputed;
    # the optimizer state comes back from the host for its step only, as in the hybrid engine
    A="--model-dir $M --shape 7b --lengths gsm8k --random-init --transformer-impl transformer_engine --packed \
--samples ${SAMPLES:-64} --skip-offload --offload-optimizer --updates ${UPDATES:-3}"
    step speed_7b 300 python3 benchmarks/train_bench.py $A --dynamic-tokens ${TOKENS:-8192} --profile "${PROFILE:-20}" \
      ${SPEED_ARGS:-} --out "$OUT/results/speed_7b.json"
    # the scale row's memory knobs: every layer recomputed (MFU counts 6*N*tokens, so recompute costs it ~25%)
    [ "${RECOMPUTE_RUN:-1}" = 1 ] && step speed_7b_recompute 240 python3 benchmarks/train_bench.py $A --recompute \
      --dynamic-tokens 16384 ${SPEED_ARGS:-} --out "$OUT/results/speed_7b_recompute.json"
    grep -h "train_mfu\|peak_memory" "$OUT/results/speed_7b"*.json
    ;;
  speed7bcmp)
    # issue 19's two ratios at 7B, same lease: local vs TE (both padded), then packed vs padded (both TE); every run
    # recomputes layers and cuts micro-batches at TOKENS (8192: the padded ones grow to ~1.7x that with padding)
    M=$(scale_model 7b)
    A="--model-dir $M --shape 7b --lengths gsm8k --random-init --samples ${SAMPLES:-64} --skip-offload --offload-optimizer \
--updates ${UPDATES:-3} --recompute --dynamic-tokens ${TOKENS:-8192} ${SPEED_ARGS:-}"
    step speed_7b_local 240 python3 benchmarks/train_bench.py $A --transformer-impl local --out "$OUT/results/speed_7b_local.json"
    step speed_7b_te 200 python3 benchmarks/train_bench.py $A --transformer-impl transformer_engine \
      --peer "$OUT/results/speed_7b_local.json" --out "$OUT/results/speed_7b_te.json"
    step speed_7b_te_packed 200 python3 benchmarks/train_bench.py $A --transformer-impl transformer_engine --packed \
      --peer "$OUT/results/speed_7b_te.json" --out "$OUT/results/speed_7b_te_packed.json"
    grep -h "_vs_\|train_mfu\|peak_memory" "$OUT"/results/speed_7b_{local,te,te_packed}.json
    ;;
  moe)
    M=${MODEL:-/tmp/qwen3_moe_1b}; K=${MOE_STEPS:-4}
    [ -f "$M/config.json" ] || step moe_model 50 python3 benchmarks/multi_gpu_bench.py model --dir "$M" --shape moe_1b
    A="--config-name grpo_trainer preset=0.5b_1gpu actor_rollout_ref.model.path=$M data.train_files=$M/data/train.parquet \
data.val_files=$M/data/test.parquet data.max_prompt_length=64 data.max_response_length=256 data.train_batch_size=16 \
actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.n=8 \
actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.rollout.ignore_eos=true \
actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.name=vllm trainer.device=cuda \
actor_rollout_ref.rollout.enable_rollout_routing_replay=true trainer.total_training_steps=$K trainer.max_time_s=60 \
trainer.test_freq=-1 trainer.save_freq=-1 trainer.val_before_train=false trainer.logger=[console,jsonl] \
trainer.progress_bar=false ${MOE_ARGS:-}"
    echo "moe: model $M, $K steps a run; progress: tail -f $OUT/moe_*.log"
    # shellcheck disable=SC2086
    step moe_grpo_noreplay 225 python3 -m hybridrl.trainer.main_ppo $A actor_rollout_ref.actor.router_replay.mode=disabled \
      trainer.default_local_dir="$OUT/moe_noreplay"
    grep -h "start-up\|max_time_s\|rollout_vs_actor/\|perf/mfu\|reshard_stream" "$OUT/moe_grpo_noreplay.log" | tail -n 8
    # shellcheck disable=SC2086
    step moe_grpo_r3 150 python3 -m hybridrl.trainer.main_ppo $A actor_rollout_ref.actor.router_replay.mode=R3 \
      trainer.default_local_dir="$OUT/moe_r3"
    grep -h "start-up\|max_time_s\|rollout_vs_actor/\|perf/mfu\|reshard_stream" "$OUT/moe_grpo_r3.log" | tail -n 8
    # the trainer runs' engine settings (max_model_len, capture sizes for 16 x 8 rows, routing recorded), so
    # vLLM's compile cache from the runs above applies
    step moe_gap 115 python3 benchmarks/gap_bench.py --model-dir "$M" --prompts 32 --max-tokens 256 \
      --rollout-rows 128 --override actor_rollout_ref.rollout.enable_rollout_routing_replay=true \
      --override actor_rollout_ref.rollout.gpu_memory_utilization=0.4 --out "$OUT/moe_gap.json"
    grep -E "_vs_" "$OUT/moe_gap.log"
    step moe_report 25 python3 benchmarks/moe_report.py --noreplay "$OUT/moe_noreplay/logs/metrics.jsonl" \
      --r3 "$OUT/moe_r3/logs/metrics.jsonl" --gap "$OUT/moe_gap.json" --model-dir "$M" \
      --command "OUT=\$OUT bash benchmarks/gpu_run.sh moe  # trainer: $A" --out "$OUT/results/moe_grpo.json"
    cat "$OUT/results/moe_grpo.md" 2>/dev/null
    ;;
  moetest)
    step test_vllm_moe 420 python3 -m pytest -q -x -s tests/gpu/test_vllm_moe.py
    grep -h "^\[moe gpu\]" "$OUT/test_vllm_moe.log"
    ;;
  scalemodel)
    shift; for S in "$@"; do scale_model "$S"; done
    ;;
  scale)
    set -f  # the overrides travel as one word-split string: `[console,jsonl]` must not glob
    S=${2:?usage: gpu_run.sh scale 0.5b|1.5b|3b|7b}
    ROW=${SCALE_ROW:-$(scale_shape_args "$S")} || { echo "scale: no row for shape $S in scale_shape_args (gpu_run.sh)"; exit 2; }
    M=$(scale_model "$S"); RUN=$OUT/scale_$S
    rm -rf "$RUN"; mkdir -p "$RUN"  # the trainer appends to metrics.jsonl: a rerun starts clean
    A="$(scale_common "$M" "$RUN") $ROW ${SCALE_ARGS:-}"
    if [ "${CPU:-0}" = 1 ]; then DEV=cpu; GIB=80; else
      IFS='|' read -r DEV GIB < <($PY -c "import torch; print(torch.cuda.get_device_name(), '|', \
f'{torch.cuda.mem_get_info()[1] / 2**30:.1f}', sep='')"); fi
    # shellcheck disable=SC2086
    $PY -m hybridrl plan $A --json --gpu-mem-gb "$GIB" > "$RUN/plan.json" 2> "$RUN/plan.err"
    echo "plan rc=$? ($GIB GiB): $(grep -v -i "warn" "$RUN/plan.err" | tail -n 2)"
    CMD="$PY -m hybridrl.trainer.main_ppo $A"
    $PY -c 'import json, sys; a = sys.argv; json.dump({"shape": a[1], "model_shape": a[2], "device": a[3],
"gpu_memory_gib": float(a[4]), "model_dir": a[5], "shape_overrides": a[6].split(), "extra_overrides": a[7].split(),
"command": a[8]}, open(a[9], "w"), indent=1)' "$S" "$(basename "$M" | sed 's/^m_//')" "$DEV" "$GIB" "$M" "$ROW" \
      "${SCALE_ARGS:-}" "$CMD" "$RUN/run.json"
    LEFT=$(( ${SCALE_BUDGET_S:-570} - SECONDS - 20 ))  # what the call has left, less the report's share
    [ "$LEFT" -gt 60 ] || LEFT=60
    echo "scale $S: model $M, trainer for at most ${LEFT}s; progress: tail -f $OUT/scale_$S.log"
    # shellcheck disable=SC2086
    step "scale_$S" "$LEFT" $CMD
    grep -h "start-up\|max_time_s\|Error\|error:" "$OUT/scale_$S.log" | tail -n 4
    STEP_TAIL=0 step scale_report 20 $PY benchmarks/scale_report.py --in-dir "$OUT" --out "$OUT/results/megatron_scale.json" \
      --command "OUT=\$OUT ${CPU:+CPU=$CPU }bash benchmarks/gpu_run.sh scale SHAPE  # each run's trainer command: runs.SHAPE.command"
    cat "$OUT/results/megatron_scale.md" 2>/dev/null
    ;;
  *)
    echo "gpu_run.sh: unknown mode '$MODE' (see the header of benchmarks/gpu_run.sh for the modes)" >&2; exit 2
    ;;
esac
