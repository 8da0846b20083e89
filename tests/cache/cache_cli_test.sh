#!/usr/bin/env bash
# `gmjit cache` through the executable, one case per run (no GPU, nothing compiled: maintenance
# goes by file names and sizes, so entries need no valid content). Exit 77: skipped.
#   json_survives_a_non_utf8_cache_path      --json output is written whatever bytes a path holds
#   prune_reports_the_stale_temp_files_it_removed
#   clear_fails_naming_a_folder_it_cannot_read
#   prune_names_a_folder_it_cannot_read_once
# Root reads any folder: as root, the cases about permissions run gmjit through setpriv without
# the capabilities that ignore permission bits, and skip where setpriv is missing.
set -euo pipefail
gmjit="$1"
case_name="$2"
work="$(mktemp -d)"
trap 'chmod -R u+rwx "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
unset GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY GMJIT_CACHE_MAXSIZE
export LC_ALL=C  # grep by bytes
umask 077
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }

# shellcheck disable=SC2054  # one argument: setpriv takes a comma-separated list
without_override=(setpriv --bounding-set=-dac_override,-dac_read_search)
needs_permissions() {
  if [ "$(id -u)" = 0 ] && ! "${without_override[@]}" true 2>/dev/null; then
    echo "skipped: root reads any folder, and setpriv cannot drop that here"
    exit 77
  fi
}
as_user() {  # the command, with permission bits applying to it as root too
  if [ "$(id -u)" = 0 ]; then "${without_override[@]}" "$@"; else "$@"; fi
}

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
  needs_permissions
  make_entry "$work/c" cc000000000000000000000000000000 >/dev/null
  make_entry "$work/c" dd000000000000000000000000000000 >/dev/null
  chmod 000 "$work/c/v1/cc"
  export GMJIT_CACHE_DIR="$work/c"
  as_user "$gmjit" cache stats >"$work/out" 2>"$work/err" ||
    fail "stats exited non-zero: $(cat "$work/err")"
  grep -q "cannot read $work/c/v1/cc (Permission denied)" "$work/err" ||
    fail "stats: $(cat "$work/err")"
  if as_user "$gmjit" cache clear >"$work/out" 2>"$work/err"; then
    fail "clear exited 0 with a folder it could not read: $(cat "$work/out")"
  fi
  grep -q "removed 1 entries" "$work/out" || fail "clear: $(cat "$work/out")"
  grep -q "could not read 1 folder: $work/c/v1/cc (Permission denied)" "$work/err" ||
    fail "clear: $(cat "$work/err")"
  ;;
prune_names_a_folder_it_cannot_read_once)
  # The failure names it; the stats that prune prints (--json) come from its own walk, which
  # must not warn about it a second time.
  needs_permissions
  make_entry "$work/c" cc000000000000000000000000000000 >/dev/null
  make_entry "$work/c" dd000000000000000000000000000000 >/dev/null
  chmod 000 "$work/c/v1/cc"
  export GMJIT_CACHE_DIR="$work/c"
  for json in "" --json; do
    # shellcheck disable=SC2086  # no word when empty
    if as_user "$gmjit" cache prune $json >"$work/out" 2>"$work/err"; then
      fail "prune $json exited 0 with a folder it could not read: $(cat "$work/out")"
    fi
    grep -q "could not read 1 folder: $work/c/v1/cc (Permission denied)" "$work/err" ||
      fail "prune $json: $(cat "$work/err")"
    [ "$(grep -c "$work/c/v1/cc" "$work/err")" = 1 ] ||
      fail "prune $json: the folder is reported more than once: $(cat "$work/err")"
  done
  grep -q '"entries": 1' "$work/out" || fail "prune --json: $(cat "$work/out")"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok"
