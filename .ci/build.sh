#!/usr/bin/env bash
# Configures and builds into $1 (default: build) with any extra CMake arguments after it.
set -euo pipefail
dir=${1:-build}
shift || true
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=${GMJIT_BUILD_TYPE:-Release} "$@" >/dev/null
ninja -C "$dir" ${GMJIT_TARGETS:-}
