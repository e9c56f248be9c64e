#!/usr/bin/env bash
# GPU host runs, one mode per device call (each must end inside 10 minutes); logs and results go under $OUT.
#   stage: bash /tmp/b/unpack.sh /tmp/site (the offline bundle, DEVELOPERS.md) + the gguf wheel + the SmolLM2 file
#   checks: tests/gpu (controller NCCL, megatron-core bf16, vLLM hybrid engine) + benchmarks/train_bench.py
#   bench:  benchmarks/hybrid_bench.py (reshard, rollout vs standalone vLLM, plan vs measured)
#   gap:    benchmarks/gap_bench.py on the random 1.5B model (each engine's log-probs vs a float32 reference)
#   grpo:   GRPO on SmolLM2-135M-Instruct + gsm_symbolic for GRPO_TIME_S seconds, then grpo_report.py
#   te:     tests/gpu/test_megatron_te.py + test_megatron_gpu.py (transformer-engine installed: its spec is the default)
#   speed:  train_bench on SHAPE (1.5b) with a GSM8K-like length spread: local vs TE, padded vs packed (same lease)
#   speed7b: train_bench on the 7B shape, TE + packed + recompute (train_mfu_7b); SPEED_ARGS adds options
set -u
MODE=${1:?usage: gpu_run.sh stage|checks|bench|gap|grpo|te|speed|speed7b}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 \
       VLLM_ENABLE_V1_MULTIPROCESSING=0 HYBRIDRL_MODEL_CACHE=/tmp/mcache TOKENIZERS_PARALLELISM=false
SMOL=/tmp/smol

STEP_TAIL=8
source "$(dirname "$0")/run_lib.sh"

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
    step hybrid_bench 420 python3 benchmarks/hybrid_bench.py --eager --out-dir "$OUT/results"
    ;;
  gap)
    M=${MODEL:-/tmp/qwen2_1.5b}
    [ -f "$M/config.json" ] || step model 300 python3 benchmarks/multi_gpu_bench.py model --dir "$M" --shape 1.5b
    step gap_bench 420 python3 benchmarks/gap_bench.py --model-dir "$M" --out "$OUT/results/gap_bench.json"
    grep -E "_vs_" "$OUT/gap_bench.log"
    ;;
  grpo)
    T=${GRPO_TIME_S:-420}
    CMD="python3 -m hybridrl.trainer.main_ppo --config-name grpo_smollm2_gsm8k actor_rollout_ref.model.path=$SMOL \
trainer.default_local_dir=$OUT/grpo trainer.max_time_s=$T trainer.total_training_steps=1000 ${GRPO_ARGS:-}"
    step grpo_smollm2 580 $CMD
    python3 benchmarks/grpo_report.py --metrics "$OUT/grpo/logs/metrics.jsonl" --command "$CMD" \
      --out "$OUT/results/grpo_smollm2.json" > "$OUT/grpo_report.log" 2>&1; tail -n 40 "$OUT/grpo_report.log"
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
    step speed_te_packed 150 python3 benchmarks/train_bench.py $A --transformer-impl transformer_engine --packed \
      --peer "$OUT/results/speed_${S}_te.json" --out "$OUT/results/speed_${S}_te_packed.json"
    grep -h "_vs_\|train_mfu" "$OUT/results/speed_${S}"_*.json
    ;;
  speed7b)
    M=/tmp/m_7b
    [ -f "$M/config.json" ] || step model 300 python3 benchmarks/multi_gpu_bench.py model --dir "$M" --shape 7b
    step speed_7b 420 python3 benchmarks/train_bench.py --model-dir "$M" --shape 7b --lengths gsm8k \
      --transformer-impl transformer_engine --packed --dynamic-tokens ${TOKENS:-16384} --samples ${SAMPLES:-64} \
      --recompute --skip-offload --updates 2 ${SPEED_ARGS:-} --out "$OUT/results/speed_7b.json"
    grep -h "train_mfu\|peak_memory" "$OUT/results/speed_7b.json"
    ;;
esac
