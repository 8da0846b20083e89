#!/usr/bin/env bash
# `gmjit cache` when it cannot do what it was asked, without compiling anything: a read-only cache
# refuses clear and prune, and warnings carry the "gmjit cache:" prefix once.
set -euo pipefail
gmjit="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY GMJIT_CACHE_MAXSIZE
umask 077
fail() { echo "FAIL: $*" >&2; exit 1; }

# Eviction and clear go by file name and size, so entries need no valid content here.
make_entry() {  # cache root, 32 hex digits; prints the path
  local dir="$1/v1/${2:0:2}"
  mkdir -p "$dir"
  head -c 1000 /dev/zero >"$dir/$2.sm_90a.grad.gmk"
  echo "$dir/$2.sm_90a.grad.gmk"
}
make_entry "$work/ro" 0123456789abcdef0123456789abcdef >/dev/null

# A read-only cache refuses to be modified, and says why.
for action in clear prune; do
  if GMJIT_CACHE_DIR="$work/ro" GMJIT_CACHE_READONLY=1 "$gmjit" cache "$action" \
    >"$work/out" 2>"$work/err"; then
    fail "cache $action on a read-only cache exited 0: $(cat "$work/out")"
  fi
  grep -q "read-only (GMJIT_CACHE_READONLY" "$work/err" || fail "$action: $(cat "$work/err")"
done
[ -n "$(find "$work/ro" -name '*.gmk')" ] || fail "a read-only cache lost its entry"

# One prefix per warning line.
GMJIT_CACHE_DIR="$work/c2" GMJIT_CACHE_MAXSIZE=lots "$gmjit" cache stats >/dev/null 2>"$work/err"
grep -q "^gmjit cache: GMJIT_CACHE_MAXSIZE='lots'" "$work/err" || fail "$(cat "$work/err")"
echo "ok"
