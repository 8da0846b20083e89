#!/usr/bin/env bash
# One GPU call that times ablated kernels against the tree's own (run from the repo root on the
# GPU machine, with .devcarry/ carried for its headers): builds the tree and, in parallel, one
# copy per variant of benchmarks/template_ablation.py ($GMJIT_ABLATIONS, default every
# fc2-dgrad-* variant), then compares each variant's kernels matching $GMJIT_NCU_KERNELS
# (default fc2_dgrad) with the tree's under Nsight Compute on $GMJIT_NCU_CASES (ab_bench.py
# --ncu). The variants compute wrong results: only their kernels' own times mean anything.
# Logs and JSON go to $OUT; the tables are printed last.
set -uo pipefail
OUT=${OUT:-/tmp/gmjit-ablation-out}
mkdir -p "$OUT"
root=$(pwd)
inc="$root/.devcarry/include"
variants=${GMJIT_ABLATIONS:-fc2-dgrad-noload fc2-dgrad-nostore fc2-dgrad-nomath fc2-dgrad-noepilogue}
kernels=${GMJIT_NCU_KERNELS:-fc2_dgrad}
cases=${GMJIT_NCU_CASES:-mixtral e64 qwen3-30b-a3b}
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }

# shellcheck source=.ci/gpu_build.sh
source "$root/.ci/gpu_build.sh"
jobs=()
build /tmp/gmjit-ablation-tree "$root" gmjit_cli &
jobs+=($!)
for v in $variants; do
  rm -rf "/tmp/gmjit-ablation-src-$v"
  python3 benchmarks/template_ablation.py "$root" "/tmp/gmjit-ablation-src-$v" "$v" >/dev/null || exit 1
  build "/tmp/gmjit-ablation-$v" "/tmp/gmjit-ablation-src-$v" gmjit_cli &
  jobs+=($!)
done
for j in "${jobs[@]}"; do wait "$j" || exit 1; done
stamp built
for v in $variants; do
  # shellcheck disable=SC2086
  timeout 200 python3 benchmarks/ab_bench.py --a /tmp/gmjit-ablation-tree/cli/gmjit \
    --a-env GMJIT_CACHE_DIR=/tmp/gmjit-ablation-cache-tree --b "/tmp/gmjit-ablation-$v/cli/gmjit" \
    --b-env "GMJIT_CACHE_DIR=/tmp/gmjit-ablation-cache-$v" --rounds 1 --repeats 2 --ncu "$kernels" \
    --json "$OUT/ncu-$v.json" $cases >"$OUT/ncu-$v.txt" 2>&1
  stamp "$v"
done
for v in $variants; do
  echo "== $v (A = tree, B = variant)"
  tail -12 "$OUT/ncu-$v.txt"
done
