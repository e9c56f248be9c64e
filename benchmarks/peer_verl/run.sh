#!/usr/bin/env bash
# Staging for the verl side-by-side runs, and the old name of their rows in benchmarks/runs.py (peer_verl/rows.py).
#   stage:     unpack .gpu_verl (carried in this call, or earlier into /tmp/bv) into /tmp/verl_site; check both environments; materialize
#              SmolLM2's HF folder; write the random 1.5B Qwen2 folder. Needs our bundle staged (gpu_run.sh stage).
#   stage_megatron: `stage` plus the checks of verl's Megatron path on the GPU (check_megatron_imports.py with TE,
#              check_verl_config.py) and the random 1.5B and 7B folders WITH weights (verl's Megatron and FSDP
#              engines always load the HF folder: no dummy init; 7B: 15.2 GB in bf16). Needs TE in /tmp/site.
#              QUICK=1: the folders only, no checks.
# Any other MODE runs the row peer_MODE: `python3 benchmarks/runs.py run peer_MODE` (DRY=1: `runs.py show`, the
# commands only); its knobs (STEPS, CAP, SEED, OURS_ARGS, VERL_ARGS, SAVE_FREQ) are read from the environment.
set -u
MODE=${1:?"usage: run.sh stage|stage_megatron|MODE (the modes: python3 benchmarks/runs.py list | grep peer_)"}
OUT=${OUT:-/tmp/out}
if [ "$MODE" != stage ] && [ "$MODE" != stage_megatron ]; then
  HOW=run; [ -n "${DRY:-}" ] && HOW=show
  exec "${PY:-python3}" "$PWD/benchmarks/runs.py" --out "$OUT" "$HOW" "peer_$MODE"
fi
mkdir -p "$OUT/results"
HERE=$PWD/benchmarks/peer_verl
SMOL=/tmp/smol; M15=/tmp/m_1p5b; M7=/tmp/m_7b
# GiB of the first GPU (check_verl_config.py adds the 80 GB offloads below 100)
GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{printf "%.0f", $1/1024}')
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       HYBRIDRL_MODEL_CACHE=/tmp/mcache WANDB_MODE=disabled RAY_USAGE_STATS_ENABLED=0
OURS_PATH=$PWD:/tmp/site
# verl gets its own transformers first; the shims folder's sitecustomize.py runs in every process it starts
VERL_PATH=$HERE/shims:/tmp/verl_site:/tmp/site
STEP_TAIL=8
source "$PWD/benchmarks/run_lib.sh"

verl_site() {  # .gpu_verl carried in this call, or copied to /tmp/bv by an earlier call of the lease
  mkdir -p /tmp/bv && { [ ! -d .gpu_verl ] || cp .gpu_verl/v_* .gpu_verl/unpack.sh /tmp/bv/; } \
    && bash /tmp/bv/unpack.sh /tmp/verl_site
}

ours_smol_dir() { PYTHONPATH=$OURS_PATH smol_dir; }  # run_lib.sh's, with our site (verl's runs set another)

model_with_weights() {  # model_with_weights SHAPE DIR: the random Qwen2.5 folder with its weights (verl loads them)
  [ -f "$2/config.json" ] && ls "$2"/*.safetensors > /dev/null 2>&1 && return 0
  rm -rf "$2"; step "model_$1" 420 env PYTHONPATH=$OURS_PATH python3 benchmarks/multi_gpu_bench.py model --dir "$2" --shape "$1"
}

case "$MODE" in
  stage)
    verl_site
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
  stage_megatron)
    verl_site || exit 1
    [ -d /tmp/site/vllm ] || { echo "our bundle is not at /tmp/site: run benchmarks/gpu_run.sh stage first"; exit 1; }
    PYTHONPATH=/tmp/site python3 -c "import transformer_engine.pytorch, transformer_engine_torch" > /dev/null 2>&1 \
      || { echo "transformer-engine is not in /tmp/site: bash benchmarks/te/install.sh /tmp/site --wait 240 first"; exit 1; }
    # QUICK=1: only the inputs (verl's site, the SmolLM2 and model folders), for a lease whose machine passed the
    # checks below before (2026-11-28): they take about 2 minutes and a GPU
    if [ -n "${QUICK:-}" ]; then
      [ -d "$SMOL" ] && { S=$(ours_smol_dir); echo "smol HF folder: $S"; }
      [ -n "${SKIP_1P5B:-}" ] || model_with_weights 1.5b "$M15"
      [ -n "${SKIP_7B:-}" ] || model_with_weights 7b "$M7"
      exit 0
    fi
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
    # verl's Megatron engine on one GPU (the caller's first, else GPU 0) with TE, a 2-layer model of head_dim 128
    # (/tmp/m_engine): build, weight load and export, a packed (THD) log-prob pass against transformers, one
    # train_batch (about a minute; its FAIL line is the exact reason if verl's Megatron backend cannot run here).
    # The stage goes on either way: the FSDP runs need the models.
    CUDA_VISIBLE_DEVICES=$(first_gpu) CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH=$VERL_PATH timeout 300 python3 \
      "$HERE/check_megatron_engine.py" --device cuda --model /tmp/m_engine --make-model /tmp/m_tiny --job 1p5b --forward \
      --out "$OUT/megatron_engine_gpu.json" > "$OUT/megatron_engine_gpu.log" 2>&1
    echo "megatron engine check rc=$?"; grep -E "^(ok|FAIL|     at)" "$OUT/megatron_engine_gpu.log" | cut -c1-300
    [ -n "${SKIP_7B:-}" ] || model_with_weights 7b "$M7"
    df -h /tmp | tail -1; free -g | head -2
    ;;
esac
