#!/usr/bin/env bash
# The Python package's GPU check, run from the repo root on the GPU machine (no network there):
# builds and installs the package into the image's python3 (which holds torch, transformers,
# nanobind and scikit-build-core; GMJIT_VENV=DIR makes a venv on top of it instead), runs the GPU
# pytest suite, then the CPU-cost benchmark, the transformers
# block benchmark and the training example; short tables last. Needs .devcarry/include with
# xxhash.h and dlpack/dlpack.h (see .ci/gpu.sh). Skip parts with GMJIT_SKIP_TRAIN=1,
# GMJIT_SKIP_BENCH=1. Full logs go to $OUT (default /tmp/gmjit-py-out).
set -uo pipefail
OUT=${OUT:-/tmp/gmjit-py-out}
mkdir -p "$OUT"
root=$(pwd)
# The GPU image's python3 is itself a venv holding torch, nanobind and scikit-build-core; a venv
# made from it would not see them, so by default the package goes into that interpreter.
venv=${GMJIT_VENV:-}
export GMJIT_CACHE_DIR=${GMJIT_CACHE_DIR:-/tmp/gmjit-py-cache}
export GMJIT_GPU_REQUIRED=1  # the gpu tests fail instead of skipping where torch sees no GPU
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

start=$(date +%s)
py=python3
if [ -n "$venv" ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
  py="$venv/bin/python"
fi
inc="$root/.devcarry/include"
extra=""
[ -d "$inc" ] && extra="-DXXHASH_INCLUDE_DIR=$inc -DDLPACK_INCLUDE_DIR=$inc"
echo "== build + install ($(nproc) cores)"
CMAKE_ARGS="$extra ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$py" -m pip install --no-build-isolation --no-deps --no-index -v . >"$OUT/pip_install.log" 2>&1 ||
  { grep -E "error|Error|FAILED" "$OUT/pip_install.log" | head -40; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
# Run from outside the source tree so that `import gmjit` is the installed package.
cd /tmp
"$py" -c "import gmjit, torch, transformers; print('gmjit', gmjit.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'nvrtc', gmjit.nvrtc_version()); print(gmjit.devices())"

echo "== GPU tests"
timeout 420 "$py" -m pytest "$root/python/tests" -m gpu -q -rfEs -p no:cacheprovider \
  --junitxml="$OUT/pytest_gpu.xml" >"$OUT/pytest_gpu.log" 2>&1
rc=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_gpu.log" | tail -25
# The FP8 tests' layers are narrow, and take the BF16 weight gradients by default: again with
# the FP8 ones forced (a fresh process reads the variable).
echo "== FP8 GPU tests with FP8 weight gradients (GMJIT_FP8_WGRAD=fp8)"
GMJIT_FP8_WGRAD=fp8 timeout 200 "$py" -m pytest "$root/python/tests/test_gpu_fp8.py" \
  -m gpu -q -rfEs -p no:cacheprovider >"$OUT/pytest_gpu_fp8_wgrad.log" 2>&1
rc_fp8=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_gpu_fp8_wgrad.log" | tail -10
[ "$rc" -eq 0 ] && rc=$rc_fp8
"$py" -c "import gmjit; print('counters after the tests:', gmjit.counters())"

if [ -z "${GMJIT_SKIP_BENCH:-}" ]; then
  echo "== CPU cost per call"
  timeout 120 "$py" "$root/benchmarks/torch_cpu_cost.py" --json "$OUT/cpu_cost.json" 2>&1 | tail -12
  echo "== transformers MoE block"
  timeout 180 "$py" "$root/benchmarks/hf_moe_block.py" --iters 10 2>&1 | grep -vE "Warning|warn" | tail -12
fi
if [ -z "${GMJIT_SKIP_TRAIN:-}" ]; then
  echo "== train a tiny MoE LM (grouped_mm vs gmjit)"
  timeout 200 "$py" "$root/examples/train_moe.py" --steps 200 2>&1 | grep -vE "Warning|warn" | tail -20
fi
echo "== done in $(( $(date +%s) - start )) s; GPU tests rc $rc"
exit "$rc"
