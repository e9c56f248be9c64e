# Shell helpers of the staging scripts (peer_verl/run.sh stage|stage_megatron); source it after setting OUT.
step() {  # step NAME TIMEOUT_S CMD...: run CMD into $OUT/NAME.log, print its exit code, time and last lines
  local name=$1 t=$2; shift 2
  local start=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - start))s"
  grep -v -i "warn" "$OUT/$name.log" | tail -n "${STEP_TAIL:-6}"
}

smol_dir() {  # the dequantized SmolLM2 HF folder of $SMOL's GGUF (made once); the first call also prints a progress line
  python3 -c "from hybridrl.utils.hf_model import materialize_hf_dir as m; print(m('$SMOL', 'SmolLM2-135M-Instruct.Q4_1.gguf'))" \
    | tail -n 1
}

first_gpu() {  # the first GPU of the caller's CUDA_VISIBLE_DEVICES (a lease lane's), else 0: a one-GPU check's GPU
  local v=${CUDA_VISIBLE_DEVICES:-}
  v=${v// /}; v=${v%%,*}
  echo "${v:-0}"
}
