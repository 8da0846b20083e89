#!/usr/bin/env bash
# One GPU session's check in a single call (device time is scarce): the C++ GPU tests and a
# bench preset (.ci/gpu.sh), memcheck on the garbage-split and width-tail tests, then the Python
# package's GPU suite (.ci/gpu_python.sh). Each part has its own time limit; a summary is last.
set -uo pipefail
OUT=${OUT:-/tmp/gmjit-round-out}
mkdir -p "$OUT"
export GMJIT_SKIP_TORCH=${GMJIT_SKIP_TORCH:-1} GMJIT_SKIP_CPU_TESTS=1 GMJIT_PRESETS=${GMJIT_PRESETS:-mixtral}
timeout ${GMJIT_CPP_LIMIT:-330} bash .ci/gpu.sh >"$OUT/cpp.txt" 2>&1
cpp_rc=$?
san_rc=skipped
if [ -z "${GMJIT_SKIP_MEMCHECK:-}" ]; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/gpu/gmjit_gpu_tests \
    --gtest_filter="${GMJIT_MEMCHECK_FILTER:-Garbage/UntrustedSplits.*:*_w200*:*_w8x16*:*decode_staged_limit*}" >"$OUT/memcheck.txt" 2>&1
  san_rc=$?
fi
py_rc=skipped
if [ -z "${GMJIT_SKIP_PYTHON:-}" ]; then
  # Its logs stay in /tmp except pytest's: at most 8 files come back from the device tool.
  OUT=/tmp/gmjit-py-out timeout ${GMJIT_PY_LIMIT:-300} bash .ci/gpu_python.sh >"$OUT/python.txt" 2>&1
  py_rc=$?
  cp /tmp/gmjit-py-out/pytest_gpu.log "$OUT/" 2>/dev/null
fi
echo "== C++ (rc $cpp_rc)"; tail -22 "$OUT/cpp.txt"
echo "== memcheck (rc $san_rc)"; grep -E "ERROR SUMMARY|PASSED|FAILED|tests ran" "$OUT/memcheck.txt" 2>/dev/null | tail -6
echo "== python (rc $py_rc)"; tail -45 "$OUT/python.txt" 2>/dev/null
for rc in "$cpp_rc" "$san_rc" "$py_rc"; do
  [ "$rc" = 0 ] || [ "$rc" = skipped ] || exit 1
done
