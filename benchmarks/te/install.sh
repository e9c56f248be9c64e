#!/usr/bin/env bash
# On the GPU host: join /tmp/b/te/t_* (benchmarks/te/bundle.sh), install transformer-engine into SITE and, when
# the bundle holds the torch extension's sdist, build it (NVTE_CUDA_ARCHS=90: H100/H200) in the background.
#   install.sh [SITE]          -> starts; the log is /tmp/te_build.log, done when /tmp/te_build.rc exists
#   install.sh [SITE] --wait S -> waits up to S seconds for the build, then copies the wheel to $OUT/te_built/
set -u
SITE=${1:-/tmp/site}
W=/tmp/te_pkg
if [ "${2:-}" != "--wait" ]; then
  rm -rf "$W" /tmp/te_build.rc && mkdir -p "$W" && cat /tmp/b/te/t_* | tar -C "$W" -xf - || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $(ls "$W"/*.whl | grep -v transformer_engine_torch) || exit 1
  # the extension goes into transformer_engine/wheel_lib/, a folder pip --target would skip as already there
  if ls "$W"/transformer_engine_torch-*.whl >/dev/null 2>&1; then
    python3 -m zipfile -e "$W"/transformer_engine_torch-*.whl "$SITE" && echo 0 > /tmp/te_build.rc
    echo "[te] prebuilt extension installed"; exit 0
  fi
  mkdir -p "$W/src" && tar -C "$W/src" -xzf "$W"/transformer_engine_torch-*.tar.gz
  # its own session: the device call's process group is killed when the call returns, the build must outlive it
  (cd "$W"/src/transformer_engine_torch-* && PYTHONPATH="$SITE:${PYTHONPATH:-}" NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 \
    NVTE_WITH_NCCL_EP=0 MAX_JOBS=16 NVTE_BUILD_MAX_JOBS=16 setsid nohup bash -c "python3 -m pip wheel -v --no-deps \
    --no-build-isolation --no-index -w '$W/built' . > /tmp/te_build.log 2>&1; echo \$? > /tmp/te_build.rc") \
    < /dev/null > /dev/null 2>&1 &
  echo "[te] building transformer_engine_torch in the background: /tmp/te_build.log"
  exit 0
fi
S=${3:-0}
for _ in $(seq 1 "$S"); do [ -f /tmp/te_build.rc ] && break; sleep 1; done
if [ ! -f /tmp/te_build.rc ]; then echo "[te] still building"; tail -n 5 /tmp/te_build.log; exit 3; fi
RC=$(cat /tmp/te_build.rc)
mkdir -p "${OUT:-/tmp/out}/te_built"
cp /tmp/te_build.log "${OUT:-/tmp/out}/te_built/te_build.log" 2>/dev/null
if [ "$RC" != 0 ]; then echo "[te] build failed ($RC)"; tail -n 60 /tmp/te_build.log; exit 1; fi
if ls "$W"/built/transformer_engine_torch-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e "$W"/built/transformer_engine_torch-*.whl "$SITE" || exit 1
  # files come back at most 16 MiB each: the wheel in 15 MiB parts (bundle.sh joins them)
  WHL=$(ls "$W"/built/transformer_engine_torch-*.whl | head -1)
  split -b 15m -d -a 1 "$WHL" "${OUT:-/tmp/out}/te_built/$(basename "$WHL").part"
fi
PYTHONPATH="$SITE:${PYTHONPATH:-}" python3 -c "import transformer_engine.pytorch as te, transformer_engine_torch; print('[te] imports', te.__file__)"
