#!/usr/bin/env bash
# Joins the verl site parts beside this script (v_0, v_1, ...) and unpacks them: unpack.sh DEST (default
# /tmp/verl_site). Idempotent: does nothing when DEST already holds the site.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd); dest=${1:-/tmp/verl_site}
[ -f "$dest/.verl-site-ok" ] && { echo "verl site already at $dest"; exit 0; }
parent=$(dirname "$dest"); mkdir -p "$parent"; rm -rf "$parent/verl_site.tmp"; mkdir "$parent/verl_site.tmp"
cat "$src"/v_* | tar -xz -C "$parent/verl_site.tmp"
rm -rf "$dest"; mv "$parent/verl_site.tmp/verl_site" "$dest"; rmdir "$parent/verl_site.tmp"
touch "$dest/.verl-site-ok"; echo "verl site unpacked to $dest ($(du -sh "$dest" | cut -f1))"
