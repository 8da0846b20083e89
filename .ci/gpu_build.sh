# Sourced by the GPU-call scripts (.ci/gpu_ab.sh, .ci/gpu_ablation.sh): a Release build with the
# carried headers ($inc: xxhash.h, dlpack/dlpack.h), its log in $OUT.
build() {  # build DIR SOURCE TARGETS...
  local dir=$1 src=$2 log
  shift 2
  log="$OUT/$(basename "$dir").build.log"
  if ! cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXXHASH_INCLUDE_DIR="$inc" \
    -DDLPACK_INCLUDE_DIR="$inc" >"$log" 2>&1 || ! ninja -C "$dir" "$@" >>"$log" 2>&1; then
    echo "build of $src failed:"
    grep -A5 -E "error|Error|FAILED" "$log" | head -40
    return 1
  fi
}
