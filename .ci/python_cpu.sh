#!/usr/bin/env bash
# The Python package on the CPU: a venv in build/pyvenv with the PyPI torch and transformers,
# `pip install .` (the wheel's own build of libgmjit and the extension), then the tests not
# marked gpu. The venv is reused when present, so reruns mostly rebuild gmjit. pip's cache is
# off: PyPI's torch brings about 5 GB of CUDA libraries, and a cached copy would double that.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GMJIT_PY_VENV:-build/pyvenv}
export PIP_NO_CACHE_DIR=1
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  free_gb=$(df -Pk "$(dirname "$venv")" | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free_gb" -lt 8 ]; then
    echo "error: the Python venv needs about 8 GB free beside $venv (torch and its CUDA" \
      "libraries); $free_gb GB are free" >&2
    exit 1
  fi
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
# The versions the GPU check runs with (torch 2.11, transformers 5.17, nanobind 3.1).
"$py" -m pip install -q --disable-pip-version-check "torch==2.11.*" "transformers==5.17.*" \
  "nanobind==3.1.*" "scikit-build-core>=0.10" pytest numpy
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$py" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps .
"$py" -m pytest python/tests -m "not gpu" -q -p no:cacheprovider
