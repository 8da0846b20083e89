#!/usr/bin/env bash
# `gmjit cache` when something is wrong, without compiling anything: warnings carry the
# "gmjit cache:" prefix once.
set -euo pipefail
gmjit="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY GMJIT_CACHE_MAXSIZE
umask 077
fail() { echo "FAIL: $*" >&2; exit 1; }

# One prefix per warning line.
GMJIT_CACHE_DIR="$work/c2" GMJIT_CACHE_MAXSIZE=lots "$gmjit" cache stats >/dev/null 2>"$work/err"
grep -q "^gmjit cache: GMJIT_CACHE_MAXSIZE='lots'" "$work/err" || fail "$(cat "$work/err")"
echo "ok"
