#!/usr/bin/env bash
# The CUDA toolkit's stub libcuda on the loader's path (a common container mistake) is named as
# such by `gmjit doctor`, not reported as a driver too old.
set -euo pipefail
gmjit="$1"
stub=""
for dir in /usr/local/cuda/lib64/stubs /usr/local/cuda/targets/*/lib/stubs; do
  if [ -e "$dir/libcuda.so" ]; then stub="$dir/libcuda.so"; break; fi
done
if [ -z "$stub" ]; then echo "skipped: no toolkit stub libcuda.so here"; exit 77; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ln -s "$stub" "$work/libcuda.so.1"
LD_LIBRARY_PATH="$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" GMJIT_CACHE_DISABLE=1 \
  "$gmjit" doctor >"$work/out" 2>&1 || true
grep -q "is the CUDA toolkit's stub library" "$work/out" || { echo "FAIL: $(cat "$work/out")" >&2; exit 1; }
echo "ok"
