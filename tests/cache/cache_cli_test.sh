#!/usr/bin/env bash
# `gmjit cache` through the executable, one case per run (no GPU, nothing compiled: maintenance
# goes by file names and sizes, so entries need no valid content). Exit 77: skipped.
#   json_survives_a_non_utf8_cache_path      --json output is written whatever bytes a path holds
#   prune_reports_the_stale_temp_files_it_removed
#   clear_fails_naming_a_folder_it_cannot_read   (not as root: root reads any folder)
set -euo pipefail
gmjit="$1"
case_name="$2"
work="$(mktemp -d)"
trap 'chmod -R u+rwx "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
unset GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY GMJIT_CACHE_MAXSIZE
export LC_ALL=C  # grep by bytes
umask 077
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }

make_entry() {  # cache root, 32 hex digits; prints the path
  local dir="$1/v1/${2:0:2}"
  mkdir -p "$dir"
  head -c 1000 /dev/zero >"$dir/$2.sm_90a.grad.gmk"
  echo "$dir/$2.sm_90a.grad.gmk"
}

case "$case_name" in
json_survives_a_non_utf8_cache_path)
  # Latin-1 "café": not UTF-8. nlohmann's dump threw after the action had run.
  root="$work/$(printf 'caf\xe9')"
  make_entry "$root" aa000000000000000000000000000000 >/dev/null
  for action in stats list "export $work/bundle" prune clear; do
    # shellcheck disable=SC2086  # the action's words
    GMJIT_CACHE_DIR="$root" "$gmjit" cache $action --json >"$work/out" 2>"$work/err" ||
      fail "cache $action --json exited non-zero: $(cat "$work/err")"
    # clear's output names no path unless something failed.
    [ "$action" = clear ] || grep -q $'\xef\xbf\xbd' "$work/out" ||
      fail "cache $action --json: no replacement character for the path: $(cat "$work/out")"
    ! grep -q "invalid UTF-8" "$work/err" || fail "cache $action --json: $(cat "$work/err")"
  done
  ;;
prune_reports_the_stale_temp_files_it_removed)
  make_entry "$work/c" bb000000000000000000000000000000 >/dev/null
  for name in .tmp-1-aaaa .tmp-2-bbbb; do
    touch -d '2 hours ago' "$work/c/v1/bb/$name"
  done
  GMJIT_CACHE_DIR="$work/c" "$gmjit" cache prune >"$work/out" ||
    fail "prune exited non-zero: $(cat "$work/out")"
  grep -q "removed 0 entries and 2 stale temp file" "$work/out" || fail "$(cat "$work/out")"
  touch -d '2 hours ago' "$work/c/v1/bb/.tmp-3-cccc"
  GMJIT_CACHE_DIR="$work/c" "$gmjit" cache prune --json >"$work/out" ||
    fail "prune --json exited non-zero: $(cat "$work/out")"
  grep -q '"stale_temps_removed": 1' "$work/out" || fail "$(cat "$work/out")"
  ;;
clear_fails_naming_a_folder_it_cannot_read)
  if [ "$(id -u)" = 0 ]; then
    echo "skipped: root reads any folder"
    exit 77
  fi
  make_entry "$work/c" cc000000000000000000000000000000 >/dev/null
  make_entry "$work/c" dd000000000000000000000000000000 >/dev/null
  chmod 000 "$work/c/v1/cc"
  GMJIT_CACHE_DIR="$work/c" "$gmjit" cache stats >"$work/out" 2>"$work/err" ||
    fail "stats exited non-zero: $(cat "$work/err")"
  grep -q "cannot read $work/c/v1/cc (Permission denied)" "$work/err" ||
    fail "stats: $(cat "$work/err")"
  if GMJIT_CACHE_DIR="$work/c" "$gmjit" cache clear >"$work/out" 2>"$work/err"; then
    fail "clear exited 0 with a folder it could not read: $(cat "$work/out")"
  fi
  grep -q "removed 1 entries" "$work/out" || fail "clear: $(cat "$work/out")"
  grep -q "could not read 1 folder: $work/c/v1/cc (Permission denied)" "$work/err" ||
    fail "clear: $(cat "$work/err")"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok"
