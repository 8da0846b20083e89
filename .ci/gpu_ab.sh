#!/usr/bin/env bash
# One GPU call that checks a kernel change against a baseline (run from the repo root on the
# GPU machine, with .devcarry/ from `bash .ci/devcarry.sh REV` carried): builds the baseline
# (.devcarry/base) and the working tree side by side, runs the tree's C++ GPU tests, memcheck on
# $GMJIT_MEMCHECK_FILTER, and, in parallel with memcheck, every preset's NVRTC time under both
# versions of kernel_templates/ (benchmarks/nvrtc_ab.py); then the A/B timing of both builds on
# $GMJIT_AB_CASES (benchmarks/ab_bench.py, alternating). Skip parts with GMJIT_SKIP_TESTS=1,
# GMJIT_SKIP_MEMCHECK=1, GMJIT_SKIP_NVRTC=1, GMJIT_SKIP_AB=1. With GMJIT_NCU_KERNELS=REGEX it
# also compares those kernels of both builds under Nsight Compute on $GMJIT_NCU_CASES
# (ab_bench.py --ncu: per-kernel time, tensor-pipe activity, DRAM bytes), which a step's time
# cannot isolate on a power-capped GPU. With GMJIT_STALLS_KERNEL=REGEX it adds, for one launch
# of that kernel per build on $GMJIT_STALLS_CASE (default e64), where its warps wait
# (benchmarks/ncu_stalls.py: stall reasons, the 12 instructions with the most samples; the
# source pages' CSVs in /tmp/gmjit-stalls, since the device tool returns only a few files).
# Logs and JSON go to $OUT; a short summary is printed
# last. About 5 minutes with every part.
set -uo pipefail
OUT=${OUT:-/tmp/gmjit-ab-out}
mkdir -p "$OUT"
root=$(pwd)
inc="$root/.devcarry/include"
base="$root/.devcarry/base"
cases=${GMJIT_AB_CASES:-mixtral gpt-oss gpt-oss:--ragged e64:--ragged qwen3-30b-a3b deepseek qwen-moe:--ragged}
presets=${GMJIT_NVRTC_CASES:-mixtral qwen-moe deepseek qwen3-30b-a3b e64 gpt-oss mixtral:--recipe=fp8-block}
filter=${GMJIT_MEMCHECK_FILTER:-*ForwardMatchesFloat64*:*UntrustedSplits*:*ZeroTokenBackward*}
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
[ -d "$base" ] || { echo "error: $base missing: run bash .ci/devcarry.sh REV and carry .devcarry" >&2; exit 1; }

# shellcheck source=.ci/gpu_build.sh
source "$root/.ci/gpu_build.sh"
build /tmp/gmjit-ab-base "$base" gmjit_cli &
base_job=$!
build build-gpu . gmjit_cli gmjit_gpu_tests || exit 1
wait $base_job || exit 1
stamp built

summary=()
if [ -z "${GMJIT_SKIP_TESTS:-}" ]; then
  GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-tests timeout 200 ctest --test-dir build-gpu -L gpu -E Workspaces \
    -j10 --timeout 150 >"$OUT/gpu_tests.log" 2>&1
  # The workspace tests read device memory: alone, after the others.
  GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-tests timeout 90 ctest --test-dir build-gpu -L gpu -R Workspaces \
    -j1 --timeout 80 >>"$OUT/gpu_tests.log" 2>&1
  summary+=("gpu tests: $(grep -E 'tests passed' "$OUT/gpu_tests.log" | tr '\n' ' ')")
  stamp tests
fi
san_job=""
if [ -z "${GMJIT_SKIP_MEMCHECK:-}" ]; then
  (GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-san timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 \
    build-gpu/tests/gpu/gmjit_gpu_tests --gtest_filter="$filter" >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc $?" >>"$OUT/memcheck.log") &
  san_job=$!
fi
if [ -z "${GMJIT_SKIP_NVRTC:-}" ]; then
  # shellcheck disable=SC2086
  timeout 200 python3 benchmarks/nvrtc_ab.py --gmjit build-gpu/cli/gmjit --a "$base/kernel_templates" --b . \
    --rounds 1 --phases --json "$OUT/nvrtc.json" $presets >"$OUT/nvrtc.txt" 2>&1
  summary+=("$(grep -E 'all [0-9]+ kernels' "$OUT/nvrtc.txt" | sed 's/^/nvrtc (base, tree s): /')")
fi
if [ -n "$san_job" ]; then
  wait "$san_job"
  summary+=("memcheck: $(grep -hE 'ERROR SUMMARY|memcheck rc' "$OUT/memcheck.log" | tr '\n' ' ')")
  stamp "memcheck + nvrtc"
fi
if [ -z "${GMJIT_SKIP_AB:-}" ]; then
  # shellcheck disable=SC2086
  timeout 200 python3 benchmarks/ab_bench.py --a /tmp/gmjit-ab-base/cli/gmjit --a-env GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-a \
    --b build-gpu/cli/gmjit --b-env GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-b --rounds "${GMJIT_AB_ROUNDS:-3}" \
    --repeats 10 --stop-after-s 170 --json "$OUT/ab.json" $cases >"$OUT/ab.txt" 2>&1
  stamp ab
fi
if [ -n "${GMJIT_NCU_KERNELS:-}" ]; then
  # shellcheck disable=SC2086
  timeout 240 python3 benchmarks/ab_bench.py --a /tmp/gmjit-ab-base/cli/gmjit --a-env GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-a \
    --b build-gpu/cli/gmjit --b-env GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-b --rounds 1 --repeats 2 \
    --ncu "$GMJIT_NCU_KERNELS" --stop-after-s 200 --json "$OUT/ncu.json" ${GMJIT_NCU_CASES:-mixtral e64} \
    >"$OUT/ncu.txt" 2>&1
  stamp ncu
fi
if [ -n "${GMJIT_STALLS_KERNEL:-}" ]; then
  # Which instructions of that kernel wait, and on what (ncu --set full, one launch per build).
  timeout 200 python3 benchmarks/ncu_stalls.py --gmjit /tmp/gmjit-ab-base/cli/gmjit \
    --env GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-a --gmjit build-gpu/cli/gmjit \
    --env GMJIT_CACHE_DIR=/tmp/gmjit-ab-cache-b --kernel "$GMJIT_STALLS_KERNEL" \
    --top 12 --save-dir /tmp/gmjit-stalls "${GMJIT_STALLS_CASE:-e64}" >"$OUT/stalls.txt" 2>&1
  stamp stalls
fi
echo "== baseline $(cat "$base/REVISION" 2>/dev/null || echo '(no REVISION)')"
printf '%s\n' "${summary[@]}"
if [ -f "$OUT/ab.txt" ]; then tail -12 "$OUT/ab.txt"; fi
if [ -f "$OUT/ncu.txt" ]; then tail -16 "$OUT/ncu.txt"; fi
if [ -f "$OUT/stalls.txt" ]; then cat "$OUT/stalls.txt"; fi
