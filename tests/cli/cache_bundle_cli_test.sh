#!/usr/bin/env bash
# End to end through the `gmjit` executable, no GPU: compile a spec file into cache A, export A,
# import into an empty cache B (twice), then B serves every kernel; A as a shared layer serves a
# "restarted rank" that writes nothing; a truncated bundle is refused and publishes nothing.
set -euo pipefail
gmjit="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY
fail() { echo "FAIL: $*" >&2; exit 1; }

cat >"$work/model.json" <<'JSON'
[{"name": "experts", "experts": 4, "hidden": 256, "ffn": 128, "router_probs": true,
  "grad": "no_grad", "arches": ["sm_90a"]}]
JSON
GMJIT_CACHE_DIR="$work/a" "$gmjit" compile --specs "$work/model.json" >"$work/cold.txt"
grep -q "compiled [1-9][0-9]* kernel" "$work/cold.txt" || fail "cold run compiled nothing: $(cat "$work/cold.txt")"

# A compile that keeps nothing for later processes fails (its whole purpose is the cache).
if GMJIT_CACHE_DISABLE=1 "$gmjit" compile --specs "$work/model.json" >/dev/null 2>"$work/off.err"; then
  fail "compile with the disk cache disabled reported success"
fi
grep -q "disk cache is disabled" "$work/off.err" || fail "no reason given: $(cat "$work/off.err")"
if GMJIT_CACHE_DIR="$work/ro" GMJIT_CACHE_READONLY=1 "$gmjit" compile --specs "$work/model.json" \
  >/dev/null 2>"$work/ro.err"; then
  fail "compile into a read-only cache reported success"
fi
grep -q "were not written" "$work/ro.err" || fail "no reason given: $(cat "$work/ro.err")"
if GMJIT_CACHE_DIR="$work/small" GMJIT_CACHE_MAXSIZE=20K "$gmjit" compile --specs "$work/model.json" \
  >/dev/null 2>"$work/small.err"; then
  fail "compile into a cache too small to keep its kernels reported success"
fi
grep -q "no longer in .*evicted" "$work/small.err" || fail "no reason given: $(cat "$work/small.err")"
# Two layers that differ only in the clamp limit share their kernels' names (the limit is a
# constant in the source, not in the name): with limit 8's kernels in a shared layer, limit 7's
# evicted FC1 kernels must count as missing although kernels of their names are still served.
layer='"experts": 4, "hidden": 256, "ffn": 128, "activation": "clamped_swiglu", "grad": "no_grad",
  "arches": ["sm_90a"]'
echo "[{\"name\": \"limit8\", \"limit\": 8, $layer}]" >"$work/limit8.json"
echo "[{\"name\": \"limit7\", \"limit\": 7, $layer}]" >"$work/limit7.json"
GMJIT_CACHE_DIR="$work/limit8" "$gmjit" compile --specs "$work/limit8.json" >/dev/null
if GMJIT_CACHE_SHARED_DIR="$work/limit8" GMJIT_CACHE_DIR="$work/limit7" GMJIT_CACHE_MAXSIZE=20K \
  "$gmjit" compile --specs "$work/limit7.json" >/dev/null 2>"$work/limit7.err"; then
  fail "kernels evicted behind same-named ones of another layer were counted as kept"
fi
grep -q "no longer in .*evicted" "$work/limit7.err" || fail "no reason given: $(cat "$work/limit7.err")"

GMJIT_CACHE_DIR="$work/a" "$gmjit" cache export "$work/a.gmjb" | grep -q "exported [1-9]" ||
  fail "export wrote no entries"
for round in 1 2; do
  GMJIT_CACHE_DIR="$work/b" "$gmjit" cache import "$work/a.gmjb" | grep -q "imported [1-9]" ||
    fail "import round $round"
done
GMJIT_CACHE_DIR="$work/b" "$gmjit" compile --specs "$work/model.json" | tail -1 >"$work/b.txt"
grep -q "compiled 0 kernel" "$work/b.txt" || fail "imported cache missed: $(cat "$work/b.txt")"

GMJIT_CACHE_SHARED_DIR="$work/a" GMJIT_CACHE_DIR="$work/local" \
  "$gmjit" compile --specs "$work/model.json" | tail -1 >"$work/shared.txt"
grep -q "compiled 0 kernel.*(\([1-9][0-9]*\) from a shared layer), 0 written" "$work/shared.txt" ||
  fail "shared layer did not serve: $(cat "$work/shared.txt")"
GMJIT_CACHE_SHARED_DIR="$work/a" GMJIT_CACHE_DIR="$work/local" "$gmjit" cache stats |
  grep -q "shared layer: $work/a/v1" || fail "cache stats does not show the shared layer"

head -c 3000 "$work/a.gmjb" >"$work/cut.gmjb"
if GMJIT_CACHE_DIR="$work/c" "$gmjit" cache import "$work/cut.gmjb" 2>"$work/cut.err"; then
  fail "a truncated bundle was imported"
fi
grep -q "truncated or damaged" "$work/cut.err" || fail "no reason given: $(cat "$work/cut.err")"
[ ! -e "$work/c" ] || fail "a refused import created the cache"
echo "ok"
