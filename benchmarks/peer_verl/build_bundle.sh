#!/usr/bin/env bash
# Builds verl 0.9.1's offline site for the GPU host (Python 3.12, cp312 manylinux x86_64): the wheels in
# verl-deps.txt installed with --no-deps into one folder, packed as tar.gz, split into parts of at most 48 MiB.
#
#   bash benchmarks/peer_verl/build_bundle.sh .gpu_verl          # parts .gpu_verl/v_0, v_1, ... + unpack.sh
#   PYVER=3.11 bash benchmarks/peer_verl/build_bundle.sh DIR     # the same for this machine's Python (CPU checks)
#
# On the host: bash DIR/unpack.sh /tmp/verl_site (benchmarks/peer_verl/run.sh stage does it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build_bundle.sh OUTDIR}
pyver=${PYVER:-3.12}
mkdir -p "$out"; out=$(cd "$out" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version "$pyver" --implementation cp)
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p"); done
grep -v -e '^#' -e '^antlr4' -e '^$' "$here/verl-deps.txt" > "$work/reqs.txt"
echo "downloading wheels for cp${pyver/./}..."
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/wheels" -r "$work/reqs.txt" 2>&1 | grep -v '^WARNING' || true
# antlr4-python3-runtime is an sdist only (pure Python): build its wheel here.
python3 -m pip wheel -q --no-deps -w "$work/wheels" "$(grep '^antlr4' "$here/verl-deps.txt")" 2>&1 | grep -v '^WARNING' || true
want=$(grep -c . "$work/reqs.txt"); got=$(ls "$work"/wheels/*.whl | grep -v antlr4 | wc -l)
[ "$want" = "$got" ] || { echo "expected $want wheels, got $got:"; ls "$work/wheels"; exit 1; }
python3 -m pip install -q --no-deps --no-index --no-compile "${plat[@]}" --target "$work/verl_site" "$work"/wheels/*.whl 2>&1 | grep -v '^WARNING' || true
rm -rf "$work"/verl_site/bin
echo "packing $(du -sh "$work/verl_site" | cut -f1) ($(ls "$work"/wheels/*.whl | wc -l) wheels)..."
rm -f "$out"/v_*
tar -C "$work" -czf - verl_site | split -b 48M -d -a 1 - "$out/v_"
cp "$here/unpack.sh" "$out/unpack.sh"
ls -la "$out"
