#!/usr/bin/env bash
# The Python package on the CPU: a venv in build/pyvenv with the PyPI torch and transformers,
# `pip install .` (the wheel's own build of libgmjit and the extension), then the tests not
# marked gpu. The venv and pip's cache are reused when present, so reruns mostly rebuild gmjit.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GMJIT_PY_VENV:-build/pyvenv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
# The versions the GPU check runs with (torch 2.11, transformers 5.17, nanobind 3.1).
"$py" -m pip install -q --disable-pip-version-check "torch==2.11.*" "transformers==5.17.*" \
  "nanobind==3.1.*" "scikit-build-core>=0.10" pytest numpy
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$py" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps .
"$py" -m pytest python/tests -m "not gpu" -q -p no:cacheprovider
