#!/usr/bin/env bash
# `gmjit cache` when it cannot do what it was asked, without compiling anything: a read-only cache
# refuses clear and prune, clear fails naming an entry it could not remove, an untrusted folder
# fails clear, prune and export, a relative
# GMJIT_CACHE_DIR creates nothing, and warnings carry the "gmjit cache:" prefix once.
set -euo pipefail
gmjit="$1"
work="$(mktemp -d)"
stuck=""
cleanup() {
  if [ -n "$stuck" ]; then
    chattr -i "$stuck" 2>/dev/null || true
    chmod 700 "$(dirname "$stuck")" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
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
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -q "read-only (GMJIT_CACHE_READONLY" "$work/err" || fail "$action: $(cat "$work/err")"
done
[ -n "$(find "$work/ro" -name '*.gmk')" ] || fail "a read-only cache lost its entry"

# An entry clear cannot remove: clear removes the rest, then fails naming it.
make_entry "$work/c" aa000000000000000000000000000000 >/dev/null
stuck="$(make_entry "$work/c" bb000000000000000000000000000000)"
if [ "$(id -u)" = 0 ]; then
  chattr +i "$stuck" 2>/dev/null || stuck=""  # root ignores permission bits
else
  chmod 500 "$(dirname "$stuck")"
fi
if [ -n "$stuck" ]; then
  if GMJIT_CACHE_DIR="$work/c" "$gmjit" cache clear >"$work/out" 2>"$work/err"; then
    fail "clear exited 0 with an entry left: $(cat "$work/out")"
  fi
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -q "removed 1 entries" "$work/out" || fail "clear: $(cat "$work/out")"
  grep -q "could not remove 1 entry: $stuck" "$work/err" || fail "clear: $(cat "$work/err")"
else
  echo "skipped: cannot make a file undeletable here"
fi

# A cache folder it does not trust: clear, prune and export fail saying so (they did nothing,
# and exited 0 as if the cache were empty), and leave the entries and no bundle behind.
untrusted="$(make_entry "$work/u" cc000000000000000000000000000000)"
chmod 770 "$work/u/v1"
for action in clear prune "export $work/u.bundle"; do
  # shellcheck disable=SC2086  # the action's words
  if GMJIT_CACHE_DIR="$work/u" "$gmjit" cache $action >"$work/out" 2>"$work/err"; then
    fail "cache $action of an untrusted folder exited 0: $(cat "$work/out")"
  fi
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -q "writable by group or others; it was not used" "$work/err" || fail "$action: $(cat "$work/err")"
  ! grep -q "removed" "$work/out" || fail "$action printed a count: $(cat "$work/out")"
done
GMJIT_CACHE_DIR="$work/u" "$gmjit" cache prune --json >"$work/out" 2>"$work/err" &&
  fail "cache prune --json of an untrusted folder exited 0"
grep -q '"error"' "$work/out" || fail "prune --json gave no error: $(cat "$work/out")"
! grep -q '"removed"' "$work/out" || fail "prune --json gave a count: $(cat "$work/out")"
[ -e "$untrusted" ] || fail "an untrusted folder lost its entry"
[ ! -e "$work/u.bundle" ] || fail "export of an untrusted folder wrote a bundle"

# GMJIT_CACHE_DIR naming a file: the cache can never be there (ENOTDIR), so clear, prune and
# export fail saying so (they exited 0 as if the cache were empty), and export writes no bundle.
echo data >"$work/afile"
for action in clear prune "export $work/f.bundle"; do
  # shellcheck disable=SC2086  # the action's words
  if GMJIT_CACHE_DIR="$work/afile" "$gmjit" cache $action >"$work/out" 2>"$work/err"; then
    fail "cache $action with GMJIT_CACHE_DIR naming a file exited 0: $(cat "$work/out")"
  fi
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -q "$work/afile/v1 cannot be a folder: a path above it is a file" "$work/err" ||
    fail "$action: $(cat "$work/err")"
  ! grep -q "removed" "$work/out" || fail "$action printed a count: $(cat "$work/out")"
done
[ ! -e "$work/f.bundle" ] || fail "export from under a file wrote a bundle"
[ "$(cat "$work/afile")" = data ] || fail "the file GMJIT_CACHE_DIR named was changed"
# A cache folder that does not exist yet is an empty cache, not an error.
GMJIT_CACHE_DIR="$work/none" "$gmjit" cache clear >"$work/out" 2>"$work/err" ||
  fail "clear of a missing cache: $(cat "$work/err")"

# A relative GMJIT_CACHE_DIR (a '~' the shell did not expand) is refused, not made here.
(cd "$work" && GMJIT_CACHE_DIR='gm' "$gmjit" cache stats >"$work/out" 2>"$work/err") &&
  fail "a relative GMJIT_CACHE_DIR was used"
grep -q "GMJIT_CACHE_DIR='gm' is not an absolute path" "$work/err" || fail "$(cat "$work/err")"
[ ! -e "$work/gm" ] || fail "a relative GMJIT_CACHE_DIR created $work/gm"
(cd "$work" && HOME="$work/home" GMJIT_CACHE_DIR='~/gm' "$gmjit" cache stats >"$work/out") ||
  fail "GMJIT_CACHE_DIR='~/gm': $(cat "$work/out")"
grep -q "local layer: $work/home/gm/v1" "$work/out" || fail "'~/gm': $(cat "$work/out")"
[ ! -e "$work/~" ] || fail "GMJIT_CACHE_DIR='~/gm' created a folder named '~'"

# export replaces only a regular file: a FIFO or a symbolic link at the path is refused and
# left as it was; import of a FIFO is refused without waiting for a writer.
mkfifo "$work/fifo"
echo kept >"$work/target"
ln -s "$work/target" "$work/link"
for name in fifo link; do
  GMJIT_CACHE_DIR="$work/c3" "$gmjit" cache export "$work/$name" >/dev/null 2>"$work/err" &&
    fail "export over a $name exited 0"
  grep -q "export '$work/$name': exists and is" "$work/err" || fail "$(cat "$work/err")"
done
[ -p "$work/fifo" ] && [ -L "$work/link" ] && [ "$(cat "$work/target")" = kept ] ||
  fail "a refused export changed what was at its path"
rc=0
timeout 20 env GMJIT_CACHE_DIR="$work/c3" "$gmjit" cache import "$work/fifo" >/dev/null \
  2>"$work/err" || rc=$?
[ "$rc" -ne 124 ] || fail "import of a FIFO waited for a writer"
[ "$rc" -ne 0 ] || fail "import of a FIFO exited 0"
grep -q "expected a bundle file" "$work/err" || fail "$(cat "$work/err")"

# One prefix per warning line.
GMJIT_CACHE_DIR="$work/c2" GMJIT_CACHE_MAXSIZE=lots "$gmjit" cache stats >/dev/null 2>"$work/err"
grep -q "^gmjit cache: GMJIT_CACHE_MAXSIZE='lots'" "$work/err" || fail "$(cat "$work/err")"
echo "ok"
