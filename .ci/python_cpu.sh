#!/usr/bin/env bash
# The Python package on the CPU: a venv in build/pyvenv with the PyPI torch and transformers,
# `pip install .` (the wheel's own build of libgmjit and the extension), then the tests not
# marked gpu. The venv is reused when present, so reruns mostly rebuild gmjit.
#
# Disk is the scarce thing on CI machines (seen: 6 GB free after the build). PyPI's torch pulls
# about 5 GB of CUDA libraries that CPU tests never call, so torch goes in without them
# (.ci/torch_slim_requirements.py) when the machine's CUDA toolkit already provides them to the
# loader: the venv then takes about 1.9 GB. Where `import torch` then fails, the full install
# follows.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GMJIT_PY_VENV:-build/pyvenv}
export PIP_NO_CACHE_DIR=1
# --no-warn-conflicts: pip would warn at every install that torch's CUDA wheels are missing.
pip_install() { "$py" -m pip install -q --disable-pip-version-check --no-warn-conflicts "$@"; }
free_gb() { df -Pk "$(dirname "$venv")" | awk 'NR == 2 { print int($4 / 1048576) }'; }
need_gb() {
  if [ "$(free_gb)" -lt "$1" ]; then
    echo "error: $2 needs about $1 GB free beside $venv; $(free_gb) GB are free" >&2
    exit 1
  fi
}
torch_pin="torch==2.11.*" # the version the GPU check runs with
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
torch_imports() { "$py" -c "import torch; torch.ones(2) @ torch.ones(2)" >/dev/null 2>&1; }

if ! torch_imports; then
  need_gb 3 "torch without its CUDA wheels"
  pip_install --no-deps "$torch_pin"
  mapfile -t slim < <("$py" .ci/torch_slim_requirements.py)
  echo "torch without the CUDA wheels this machine's toolkit provides; with: ${slim[*]}"
  pip_install "${slim[@]}"
  if ! torch_imports; then
    echo "note: torch does not load against this machine's CUDA libraries; installing them from PyPI"
    need_gb 7 "torch with its CUDA wheels"
    pip_install "$torch_pin"
  fi
fi
torch_imports || { "$py" -c "import torch"; exit 1; }
pip_install "transformers==5.17.*" "nanobind==3.1.*" "scikit-build-core>=0.10" pytest numpy
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) pip_install --no-build-isolation --no-deps .
"$py" -m pytest python/tests -m "not gpu" -q -p no:cacheprovider
