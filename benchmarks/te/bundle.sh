#!/usr/bin/env bash
# Here (with the package index): transformer-engine 2.20.2 for the GPU host (torch 2.11 cu130, Python 3.12)
# in parts of at most 48 MiB: OUTDIR/t_0, t_1, ... (DEVELOPERS.md "Transformer Engine" says how they travel).
#   the core library wheel (transformer-engine-cu13, prebuilt), the python package (transformer-engine),
#   nvdlfw-inspect and nvidia-cudnn-frontend (headers for the build), and either the torch extension built on
#   the host before (its parts as install.sh brings them back, kept in BUILT, default .gpu/te_built) or its
#   sdist, which install.sh then compiles there (33 C++ files against torch's headers, a few minutes).
set -euo pipefail
OUT=${1:-.gpu/te}
V=2.20.2
rm -rf "$OUT" && mkdir -p "$OUT/pkg"
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: $PLAT -d "$OUT/pkg" \
  "transformer-engine-cu13==$V" "transformer-engine==$V" nvdlfw-inspect==0.2.2 nvidia-cudnn-frontend==1.32.0
BUILT=${BUILT:-.gpu/te_built}
PARTS=$(ls "$BUILT"/transformer_engine_torch-$V-*.whl.part0 2>/dev/null | head -1 || true)
if [ -n "$PARTS" ]; then
  cat "${PARTS%0}"? > "$OUT/pkg/$(basename "${PARTS%.part0}")"
else  # the sdist; pip download would try to build its metadata here (no CUDA): take the file from the index
  python3 - "$OUT/pkg" "$V" <<'PY'
import re, sys, urllib.request
out, v = sys.argv[1], sys.argv[2]
html = urllib.request.urlopen("https://pypi.org/simple/transformer-engine-torch/", timeout=120).read().decode()
url = re.findall(rf'href="([^"#]*transformer_engine_torch-{re.escape(v)}\.tar\.gz)', html)[0]
urllib.request.urlretrieve(url, f"{out}/transformer_engine_torch-{v}.tar.gz")
PY
fi
tar -C "$OUT/pkg" -cf - . | split -b 48m -d -a 1 - "$OUT/t_"
rm -rf "$OUT/pkg"
ls -la "$OUT"
