#!/usr/bin/env bash
# gmjit as a library caller gets it: `cmake --install` of this build into a fresh prefix, then a
# separate project finds it with find_package(gmjit) and builds and runs a C and a C++ program;
# the installed `gmjit` command starts, the installed library and command carry the run path to
# NVRTC (where ld.so.conf lists the toolkit they would start without it), and the build folder
# holds no package file that find_package could pick up half made.
set -euo pipefail
build="$1"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

[ ! -e "$build/gmjitConfig.cmake" ] || fail "$build/gmjitConfig.cmake exists without its targets file"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || fail "$(cat "$work/install.log")"
GMJIT_CACHE_DISABLE=1 "$work/prefix/bin/gmjit" doctor >"$work/doctor" 2>&1 ||
  fail "the installed gmjit does not start: $(cat "$work/doctor")"
grep -q "nvrtc:" "$work/doctor" || fail "doctor: $(cat "$work/doctor")"
for installed in "$work/prefix/bin/gmjit" "$work"/prefix/lib*/libgmjit.so; do
  readelf -d "$installed" | grep -q "RUNPATH\|RPATH" || fail "$installed has no run path to NVRTC"
done
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$here/consumer" -B "$work/consumer" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 ||
  fail "find_package(gmjit): $(cat "$work/configure.log")"
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || fail "consumer build: $(cat "$work/build.log")"
GMJIT_CACHE_DISABLE=1 "$work/consumer/consumer_c"
GMJIT_CACHE_DISABLE=1 "$work/consumer/consumer_cpp"
echo "ok"
