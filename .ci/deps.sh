#!/usr/bin/env bash
# Installs the Debian packages gmjit builds with (the CUDA toolkit with NVRTC is assumed
# installed: nvcc on PATH or /usr/local/cuda). Skips apt when everything is already there.
set -euo pipefail
packages=(cmake ninja-build g++ libfmt-dev libgtest-dev libxxhash-dev libcli11-dev
  nlohmann-json3-dev libdlpack-dev libbenchmark-dev gnuplot-nox clang-format)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# The Python package's venv and extension: Debian's python3 ships venv (ensurepip) and the
# headers as separate packages; a python3 from elsewhere (pyenv) has both.
if command -v python3 >/dev/null; then
  python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
  py_inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null || true)
  [ -n "$py_inc" ] && [ -f "$py_inc/Python.h" ] || missing+=(python3-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! ls /usr/local/cuda/include/nvrtc.h >/dev/null 2>&1 && ! command -v nvcc >/dev/null; then
  echo "error: the CUDA toolkit (NVRTC 12.8 or newer) is required; install it first" >&2
  exit 1
fi
