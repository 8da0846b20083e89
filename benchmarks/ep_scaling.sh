#!/usr/bin/env bash
# Expert-parallel scaling over world sizes: per size, a cold launch (all ranks racing to compile
# into one fresh GMJIT_CACHE_DIR), then a warm relaunch on that directory (a restarted job: the
# first step should read every kernel from disk) that also times throughput; then the table.
#
#   bash benchmarks/ep_scaling.sh [WORLD_SIZES...] [-- ep_scaling.py options]
#
# World sizes default to 1 2 4 8, keeping those not above the GPUs present. Records go to
# ${EP_SCALING_OUT:-ep_scaling.jsonl} (appended). EP_SCALING_CPU=1 runs over gloo with torch experts
# and EP_SCALING_RANKS ranks at most (default 2), to check the script on a machine without a GPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sizes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  sizes+=("$1")
  shift
done
[ "${1:-}" = "--" ] && shift
extra=("$@")
out=${EP_SCALING_OUT:-ep_scaling.jsonl}
python=${PYTHON:-python3}

if [ "${EP_SCALING_CPU:-0}" = 1 ]; then
  available=${EP_SCALING_RANKS:-2}
  extra+=(--cpu)
else
  available=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "$available" -eq 0 ]; then
    echo "error: no GPU found (nvidia-smi -L lists none); EP_SCALING_CPU=1 checks the script" >&2
    exit 1
  fi
fi
[ ${#sizes[@]} -eq 0 ] && sizes=(1 2 4 8)

ran=()
for n in "${sizes[@]}"; do
  if [ "$n" -gt "$available" ]; then
    echo "skipping world size $n: $available GPU(s) here"
    continue
  fi
  cache=$(mktemp -d "${TMPDIR:-/tmp}/gmjit-ep-cache.XXXXXX")
  for start in cold warm; do
    echo "== world size $n, $start start (GMJIT_CACHE_DIR=$cache)"
    GMJIT_CACHE_DIR=$cache "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" \
      "$here/ep_scaling.py" --cache-state "$start" --json "$out" "${extra[@]}"
  done
  rm -rf "$cache"
  ran+=("$n")
done
[ ${#ran[@]} -gt 0 ] || { echo "error: no world size fits $available GPU(s)" >&2; exit 1; }
echo
"$python" "$here/ep_scaling.py" --report "$out"
