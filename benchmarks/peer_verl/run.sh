#!/usr/bin/env bash
# verl 0.9.1 and hybridrl, the same GRPO job on the same GPU, one mode per device call (each well inside 10 min).
# Logs and results under $OUT (default /tmp/out). Settings for both sides come from settings.py.
#   stage:     unpack .gpu_verl (carried in this call) into /tmp/verl_site; check both environments; materialize
#              SmolLM2's HF folder; write the random 1.5B Qwen2 folder. Needs our bundle staged (gpu_run.sh stage).
#   verl_smol / ours_smol:  GRPO on SmolLM2-135M-Instruct + gsm_symbolic (val before and after)
#   ours_smol_seed (SEED=N): ours_smol with data.seed=N into $OUT/ours_smol_seedN (the learning-speed spread)
#   verl_smol_seed (SEED=N): verl_smol with data.seed=N into $OUT/verl_smol_seedN (verl's spread)
#   ours_smol_verl_order: ours_smol on verl's prompt order (verl_order.py), unshuffled: the same prompts each step
#   verl_1p5b / ours_1p5b:  5 GRPO steps on the random 1.5B model
#   report:    report.py over the four runs -> $OUT/results/peer_verl.json + .md
#   verl_JOB_1 / verl_JOB_2 (JOB smol or 1p5b): verl's run in two calls of one lease (README.md: two device calls)
#   The modes above are issue 18's (settings.py --padded: padded batches, fixed micro-batches on both sides).
# Issue 34, each trainer with its best documented settings (settings.py without --padded):
#   stage_megatron: `stage` plus the checks of verl's Megatron path on the GPU (check_megatron_imports.py with TE,
#              check_verl_config.py) and the random 1.5B and 7B folders WITH weights (verl's Megatron and FSDP
#              engines always load the HF folder: no dummy init; 7B: 15.2 GB in bf16). Needs TE in /tmp/site.
#   verl_megatron_JOB (JOB smol|1p5b|7b|7b_4gpu), verl_7b_4gpu (FSDP), ours_7b, ours_7b_4gpu,
#   ours_best_smol / ours_best_1p5b (hybridrl's best settings on issue 18's jobs; ours_smol etc. stay --padded),
#   ours_best_smol_seed (SEED=N): hybridrl's spread for the learning parity against verl_megatron_smol
#   report_megatron: report.py --megatron -> $OUT/results/peer_verl_megatron.json + .md
set -u
MODE=${1:?"usage: run.sh stage|verl_smol|ours_smol|ours_smol_seed|verl_smol_seed|ours_smol_verl_order|verl_1p5b|ours_1p5b|report|verl_smol_1|verl_smol_2|verl_1p5b_1|verl_1p5b_2|stage_megatron|verl_megatron_JOB|verl_7b_4gpu|ours_7b|ours_7b_4gpu|ours_best_smol|ours_best_1p5b|ours_best_smol_seed|report_megatron"}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
HERE=$PWD/benchmarks/peer_verl
SMOL=/tmp/smol; M15=/tmp/m_1p5b; M7=/tmp/m_7b
# GiB of the first GPU: settings.py adds the 80 GB offloads below 100
GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{printf "%.0f", $1/1024}')
SETTINGS_FLAGS=""  # --padded for issue 18's modes (set in the case below)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       HYBRIDRL_MODEL_CACHE=/tmp/mcache WANDB_MODE=disabled RAY_USAGE_STATS_ENABLED=0
OURS_PATH=$PWD:/tmp/site
# verl gets its own transformers 5.10.4 (and tokenizers, hub) first; the shims folder's sitecustomize.py runs in
# every process it starts. hybridrl never sees /tmp/verl_site: it keeps the host's transformers 5.17.
VERL_PATH=$HERE/shims:/tmp/verl_site:/tmp/site
STEP_TAIL=8
source "$PWD/benchmarks/run_lib.sh"

ray_stop() {  # a run killed by its timeout can leave Ray workers holding GPU memory: clear them before the next
  PYTHONPATH=/tmp/site python3 -c "import sys; from ray.scripts.scripts import main; sys.argv=['ray','stop','--force']; main()" \
    > /dev/null 2>&1 || true
}

ours_smol_dir() { PYTHONPATH=$OURS_PATH smol_dir; }  # run_lib.sh's, with our site (verl's runs set another)

train() {  # train NAME TRAINER JOB MODEL [PART]: one trainer's run with the GPU memory sampled and start-up timed
  # PART 2 resumes verl from its last checkpoint in a second device call (verl's SmolLM2 run outlives one call):
  # its metrics, times and memory samples go to *.2 files that report.py joins to the first part's.
  local name=$1 trainer=$2 job=$3 model=$4 part=${5:-1} run=$OUT/$1 sfx=""
  [ "$part" = 1 ] && rm -rf "$run"; [ "$part" = 1 ] || sfx=".$part"
  mkdir -p "$run"
  local metrics=$run/metrics.jsonl$sfx cmd
  [ "$trainer" = ours ] && metrics=$run/logs/metrics.jsonl
  mapfile -t args < <(python3 "$HERE/settings.py" "$trainer" "$job" --model "$model" --out "$run" ${STEPS:+--steps $STEPS} \
    --gpu-gib "${GIB:-80}" $SETTINGS_FLAGS)
  [ "${#args[@]}" -gt 10 ] || { echo "settings.py gave no overrides for $trainer $job"; return 1; }
  # VERL_ARGS / OURS_ARGS: diagnosis only (an override tried on one side); command.txt records it
  if [ "$trainer" = ours ]; then args+=(${OURS_ARGS:-}); else args+=(${VERL_ARGS:-}); fi
  if [ "$trainer" = ours ]; then
    cmd=(env PYTHONPATH=$OURS_PATH VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 -m hybridrl.trainer.main_ppo "${args[@]}")
  elif [ "$trainer" = verl_megatron ]; then
    # verl's Megatron examples export CUDA_DEVICE_MAX_CONNECTIONS=1 (megatron's communication/compute overlap);
    # transformer-engine comes from /tmp/site (benchmarks/te/install.sh), mbridge from /tmp/verl_site
    cmd=(env PYTHONPATH=$VERL_PATH VERL_FILE_LOGGER_PATH=$metrics CUDA_DEVICE_MAX_CONNECTIONS=1
         python3 "$HERE/launch_verl.py" "${args[@]}")
  else
    cmd=(env PYTHONPATH=$VERL_PATH VERL_FILE_LOGGER_PATH=$metrics python3 "$HERE/launch_verl.py" "${args[@]}")
  fi
  # the job's GPUs are the machine's first ones (a 4-GPU machine runs the one-GPU jobs on GPU 0)
  local gpus; gpus=$(python3 "$HERE/settings.py" "$trainer" "$job" --model x --out x --gpus)
  cmd=(env CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((gpus - 1))) "${cmd[@]:1}")
  printf '%q ' "${cmd[@]}" > "$run/command.txt$sfx"
  if [ -n "${DRY:-}" ]; then cat "$run/command.txt$sfx"; echo; return 0; fi  # DRY=1: the command only (CPU check)
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 > "$run/device.txt$sfx"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >> "$run/gpu_mem_mib.txt" 2>/dev/null &
  local smi=$!
  local t0; t0=$(date +%s.%N)
  ( while [ ! -s "$metrics" ]; do sleep 0.5; done; date +%s.%N > "$run/first_metrics_at$sfx" ) &
  local watch=$!
  step "$name" "${CAP:-570}" "${cmd[@]}"
  echo "$t0" > "$run/launched_at$sfx"; date +%s.%N > "$run/ended_at$sfx"
  kill "$smi" "$watch" 2>/dev/null; wait "$smi" "$watch" 2>/dev/null
  ray_stop
  for _ in $(seq 30); do  # the next run starts on GPUs the killed one's workers have let go of (the fullest GPU)
    [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)" -lt 2000 ] && break; sleep 1; done
  echo "peak GPU memory $(sort -n "$run/gpu_mem_mib.txt" | tail -1) MiB; metrics lines $(wc -l < "$metrics" 2>/dev/null || echo 0)"
}

model_with_weights() {  # model_with_weights SHAPE DIR: the random Qwen2.5 folder with its weights (verl loads them)
  [ -f "$2/config.json" ] && ls "$2"/*.safetensors > /dev/null 2>&1 && return 0
  rm -rf "$2"; step "model_$1" 420 env PYTHONPATH=$OURS_PATH python3 benchmarks/multi_gpu_bench.py model --dir "$2" --shape "$1"
}

case "$MODE" in
  verl_smol|ours_smol|ours_smol_seed|verl_smol_seed|ours_smol_verl_order|verl_1p5b|ours_1p5b|verl_smol_1|verl_1p5b_1|verl_smol_2|verl_1p5b_2)
    SETTINGS_FLAGS=--padded ;;
esac

case "$MODE" in
  stage)
    mkdir -p /tmp/bv && cp .gpu_verl/v_* .gpu_verl/unpack.sh /tmp/bv/ && bash /tmp/bv/unpack.sh /tmp/verl_site
    [ -d /tmp/site/vllm ] || { echo "our bundle is not at /tmp/site: run benchmarks/gpu_run.sh stage first"; exit 1; }
    PYTHONPATH=$OURS_PATH python3 -c "import torch, transformers, vllm, ray, pyarrow, pandas
print('ours:', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'pyarrow', pyarrow.__version__, 'pandas', pandas.__version__)"
    PYTHONPATH=$VERL_PATH python3 -c "import os, torch, transformers, tokenizers, vllm, ray, verl, tensordict, datasets, pyarrow
from verl.trainer import main_ppo
from verl.workers.rollout.vllm_rollout import vllm_async_server
from verl.workers import engine_workers
print('verl:', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'vllm', vllm.__version__, 'tensordict', tensordict.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'shims', os.environ.get('PEER_VERL_SHIMS_LOADED'))" 2>&1 | grep -v -i warn | tail -n 5
    S=$(ours_smol_dir); echo "smol HF folder: $S"
    [ -f "$M15/config.json" ] || [ -n "${SKIP_1P5B:-}" ] || step model_1p5b 300 env PYTHONPATH=$OURS_PATH python3 benchmarks/multi_gpu_bench.py model --dir "$M15" --shape 1.5b
    PYTHONPATH=$VERL_PATH python3 "$HERE/check_prompts.py" --model "$S" --data benchmarks/data/gsm_symbolic/test.parquet --side verl \
      --out "$OUT/prompts_verl.json" && PYTHONPATH=$OURS_PATH python3 "$HERE/check_prompts.py" --model "$S" \
      --data benchmarks/data/gsm_symbolic/test.parquet --side ours --out "$OUT/prompts_ours.json" --compare "$OUT/prompts_verl.json"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    ;;
  verl_smol) train verl_smol verl smol "$(ours_smol_dir)" ;;
  ours_smol) train ours_smol ours smol "$(ours_smol_dir)" ;;
  # hybridrl's SmolLM2 run with another data order (SEED=2 ...): is verl's faster climb inside our spread?
  ours_smol_seed) OURS_ARGS="data.seed=${SEED:?set SEED} ${OURS_ARGS:-}" train "ours_smol_seed$SEED" ours smol "$(ours_smol_dir)" ;;
  # verl's SmolLM2 run with another data order: verl's own run-to-run spread, beside hybridrl's
  verl_smol_seed) VERL_ARGS="data.seed=${SEED:?set SEED} ${VERL_ARGS:-}" train "verl_smol_seed$SEED" verl smol "$(ours_smol_dir)" ;;
  # hybridrl on verl's prompt order (verl_order.py: the draw found on 2026-11-26; the run of that day used draw 0)
  ours_smol_verl_order)
    python3 "$HERE/verl_order.py" --data benchmarks/data/gsm_symbolic/train.parquet --seed 1 --expect-rows 4096 \
      --out /tmp/verl_order/train.parquet || exit 1
    OURS_ARGS="data.train_files=[/tmp/verl_order/train.parquet] data.shuffle=false ${OURS_ARGS:-}" \
      train ours_smol_verl_order ours smol "$(ours_smol_dir)" ;;
  # verl in two calls of one lease: part 1 saves every SAVE_FREQ steps and stops at its cap; part 2 resumes from
  # the last save without validating again first
  verl_smol_1|verl_1p5b_1|verl_smol_2|verl_1p5b_2)
    job=${MODE#verl_}; part=${job##*_}; job=${job%_*}; model=$M15; [ "$job" = smol ] && model=$(ours_smol_dir)
    extra="trainer.save_freq=${SAVE_FREQ:-5}"
    [ "$part" = 2 ] && extra="$extra trainer.resume_mode=auto trainer.val_before_train=false"
    VERL_ARGS="$extra ${VERL_ARGS:-}" train "verl_$job" verl "$job" "$model" "$part" ;;
  verl_1p5b) train verl_1p5b verl 1p5b "$M15" ;;
  ours_1p5b) train ours_1p5b ours 1p5b "$M15" ;;
  report)
    PYTHONPATH=$OURS_PATH python3 "$HERE/report.py" --runs "$OUT" --out "$OUT/results/peer_verl.json"
    ;;
  stage_megatron)
    mkdir -p /tmp/bv && cp .gpu_verl/v_* .gpu_verl/unpack.sh /tmp/bv/ && bash /tmp/bv/unpack.sh /tmp/verl_site || exit 1
    [ -d /tmp/site/vllm ] || { echo "our bundle is not at /tmp/site: run benchmarks/gpu_run.sh stage first"; exit 1; }
    PYTHONPATH=/tmp/site python3 -c "import transformer_engine.pytorch, transformer_engine_torch" > /dev/null 2>&1 \
      || { echo "transformer-engine is not in /tmp/site: bash benchmarks/te/install.sh /tmp/site --wait 240 first"; exit 1; }
    # verl's Megatron path in one process (on the host everything should import; ONE_BY_ONE=1: a process each)
    PYTHONPATH=$VERL_PATH python3 "$HERE/check_megatron_imports.py" --build ${ONE_BY_ONE:+--one-by-one} \
      --out "$OUT/megatron_imports.json" 2>&1 | grep -v -i warn | tail -n 20
    # SmolLM2's folder only where its GGUF was staged (gpu_run.sh stage with g_0..g_2): the smol runs need it
    [ -d "$SMOL" ] && { S=$(ours_smol_dir); echo "smol HF folder: $S"; }
    [ -n "${SKIP_1P5B:-}" ] || model_with_weights 1.5b "$M15"
    # the tiny folder the config check reads (verl's config checks never read the model's size)
    [ -f /tmp/m_tiny/config.json ] || PYTHONPATH=$OURS_PATH python3 benchmarks/multi_gpu_bench.py model --dir /tmp/m_tiny \
      --shape tiny > /dev/null 2>&1
    PYTHONPATH=$VERL_PATH python3 "$HERE/check_verl_config.py" --model /tmp/m_tiny --gpu-gib "${GIB:-80}" \
      --out "$OUT/verl_config_check.json" 2>&1 | grep -E "^(ok|FAIL)" | cut -c1-160
    # verl's Megatron engine on GPU 0 with TE, a 2-layer model of head_dim 128 (/tmp/m_engine): build, weight load and export, a packed (THD) log-prob
    # pass against transformers, one train_batch (about a minute; its FAIL line is the exact reason if verl's
    # Megatron backend cannot run here). The stage goes on either way: the FSDP runs need the models.
    CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH=$VERL_PATH timeout 300 python3 \
      "$HERE/check_megatron_engine.py" --device cuda --model /tmp/m_engine --make-model /tmp/m_tiny --job 1p5b --forward \
      --out "$OUT/megatron_engine_gpu.json" > "$OUT/megatron_engine_gpu.log" 2>&1
    echo "megatron engine check rc=$?"; grep -E "^(ok|FAIL|     at)" "$OUT/megatron_engine_gpu.log" | cut -c1-300
    [ -n "${SKIP_7B:-}" ] || model_with_weights 7b "$M7"
    df -h /tmp | tail -1; free -g | head -2
    ;;
  verl_megatron_*|verl_7b|verl_7b_4gpu|ours_7b|ours_7b_4gpu|ours_best_smol|ours_best_1p5b|ours_best_smol_seed)
    case "$MODE" in
      verl_megatron_*) trainer=verl_megatron; job=${MODE#verl_megatron_} ;;
      ours_best_smol_seed) trainer=ours; job=smol ;;
      ours_best_*) trainer=ours; job=${MODE#ours_best_} ;;
      ours_*) trainer=ours; job=${MODE#ours_} ;;
      verl_*) trainer=verl; job=${MODE#verl_} ;;
    esac
    case "$job" in smol) model=$(ours_smol_dir) ;; 1p5b) model=$M15 ;; 7b|7b_4gpu) model=$M7 ;;
      *) echo "unknown job $job"; exit 2 ;; esac
    [ -f "$model/config.json" ] || [ -n "${DRY:-}" ] || { echo "no model at $model: run.sh stage_megatron first"; exit 1; }
    gpus=$(python3 "$HERE/settings.py" "$trainer" "$job" --model x --out x --gpus)
    have=$(nvidia-smi -L 2>/dev/null | wc -l)
    [ "$have" -ge "$gpus" ] || [ -n "${DRY:-}" ] || { echo "$MODE needs $gpus GPUs, this machine has $have"; exit 1; }
    # the one-GPU 7B job holds 137 GB of training state: an H200 only (`hybridrl plan` refuses it on 80 GB)
    if [ "$job" = 7b ] && [ "${GIB:-0}" -lt 100 ] && [ -z "${DRY:-}" ]; then
      echo "$MODE needs an H200 (this GPU: ${GIB:-?} GiB): the one-GPU 7B job does not fit 80 GB"; exit 1; fi
    name=$MODE
    if [ "$MODE" = ours_best_smol_seed ]; then
      name="ours_best_smol_seed${SEED:?set SEED}"; OURS_ARGS="data.seed=$SEED ${OURS_ARGS:-}"
    fi
    train "$name" "$trainer" "$job" "$model" ;;
  report_megatron)
    PYTHONPATH=$OURS_PATH python3 "$HERE/report.py" --megatron --runs "$OUT" --out "$OUT/results/peer_verl_megatron.json"
    ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac
