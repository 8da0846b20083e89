#!/usr/bin/env bash
# `gmjit cache` refuses arguments that do not apply to its action, before doing anything: a FILE
# only for export and import, --max-size and --older-than only for prune. A clear given prune's
# --older-than once removed every entry.
set -euo pipefail
gmjit="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY GMJIT_CACHE_MAXSIZE
export GMJIT_CACHE_DIR="$work/cache"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Clear and prune go by file name and size, so the entry needs no valid content here.
entry="$GMJIT_CACHE_DIR/v1/01/0123456789abcdef0123456789abcdef.sm_90a.grad.gmk"
mkdir -p "$(dirname "$entry")"
head -c 1000 /dev/zero >"$entry"

refused() {  # what stderr must contain, then the cache arguments
  local needle="$1"
  shift
  if "$gmjit" cache "$@" >"$work/out" 2>"$work/err"; then
    fail "'cache $*' exited 0: $(cat "$work/out")"
  fi
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -qF -- "$needle" "$work/err" || fail "'cache $*': stderr lacks \"$needle\": $(cat "$work/err")"
  [ -e "$entry" ] || fail "'cache $*' removed the entry"
}

refused "--older-than" clear --older-than 7d
refused "--max-size" clear --max-size 1K
refused "'oops'" clear oops
refused "'1K'" prune 1K
refused "'extra'" stats extra
refused "'extra'" list extra
refused "--max-size" list --max-size 1G
refused "--older-than" stats --older-than 1d
refused "--older-than" export "$work/b.gmjb" --older-than 1d
refused "--max-size" import "$work/b.gmjb" --max-size 1G
[ ! -e "$work/b.gmjb" ] || fail "a refused export wrote the bundle"

# What does apply still works.
"$gmjit" cache prune --older-than 7d --max-size 1G >/dev/null || fail "prune with its options"
[ -e "$entry" ] || fail "prune removed a fresh entry under the size bound"
# --json names the bound the prune applied beside the cache's own (GMJIT_CACHE_MAXSIZE's).
"$gmjit" cache prune --max-size 1G --json >"$work/prune.json" || fail "prune --json"
grep -q '"pruned_to_bytes": 1073741824' "$work/prune.json" ||
  fail "prune --json did not name its bound: $(cat "$work/prune.json")"
"$gmjit" cache clear >/dev/null || fail "clear"
[ ! -e "$entry" ] || fail "clear left the entry"
echo "ok"
