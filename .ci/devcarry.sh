#!/usr/bin/env bash
# Prepares .devcarry/ (git-ignored; name it in the device tool's `carry`) on the development
# machine: the headers the GPU machine lacks (include/xxhash.h, include/dlpack/dlpack.h, from
# the Debian packages .ci/deps.sh installs) and, given a git revision, that revision's tree in
# .devcarry/base, the baseline .ci/gpu_ab.sh compares the working tree against there (the GPU
# machine gets the working tree only, no git history).
#   bash .ci/devcarry.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
for h in xxhash.h dlpack/dlpack.h; do
  [ -f "/usr/include/$h" ] || { echo "error: /usr/include/$h missing: run bash .ci/deps.sh" >&2; exit 1; }
done
mkdir -p .devcarry/include/dlpack "$(git rev-parse --git-path info)"
cp /usr/include/xxhash.h .devcarry/include/
cp /usr/include/dlpack/dlpack.h .devcarry/include/dlpack/
exclude=$(git rev-parse --git-path info/exclude)
grep -qx ".devcarry/" "$exclude" 2>/dev/null || echo ".devcarry/" >>"$exclude"
if [ $# -ge 1 ]; then
  rm -rf .devcarry/base
  mkdir -p .devcarry/base
  git archive "$1" | tar -x -C .devcarry/base
  git rev-parse "$1" >.devcarry/base/REVISION
  echo ".devcarry/base: $(cat .devcarry/base/REVISION)"
fi
du -sh .devcarry
