#!/usr/bin/env bash
# `gmjit bench` and `gmjit plot` through the executable, no GPU (bench --no-gpu on the tiny
# preset, about a second). Usage: bench_plot_cli_test.sh GMJIT CASE; each CASE is its own ctest.
# Exit 77: skipped (gnuplot missing).
set -euo pipefail
gmjit="$1"
case_name="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset GMJIT_CACHE_DIR GMJIT_CACHE_SHARED_DIR GMJIT_CACHE_DISABLE GMJIT_CACHE_READONLY \
  GMJIT_CACHE_MAXSIZE
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }

# A refusal: non-zero, stderr names what was wrong, and nothing ran first (stdout is empty).
# Arguments: what stderr must contain, then the command.
expect_refusal() {
  local needle="$1"
  shift
  if "$@" >"$work/out" 2>"$work/err"; then
    fail "'$*' exited 0: $(cat "$work/out")"
  fi
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -qF -- "$needle" "$work/err" || fail "'$*': stderr lacks \"$needle\": $(cat "$work/err")"
  [ ! -s "$work/out" ] || fail "'$*' was not refused up front: $(cat "$work/out")"
}

# A failure after running: non-zero and stderr names the problem.
expect_failure() {
  local needle="$1"
  shift
  if "$@" >"$work/out" 2>"$work/err"; then
    fail "'$*' exited 0: $(cat "$work/out")"
  fi
  ! grep -q "Sanitizer" "$work/err" || fail "a sanitizer report, not a refusal: $(cat "$work/err")"
  grep -qF -- "$needle" "$work/err" || fail "'$*': stderr lacks \"$needle\": $(cat "$work/err")"
}

# The kernels_compiled of one phase of a bench --json report (printed with two-space indents).
phase_kernels() {  # report, phase
  sed -n "/\"$2\": {/,/}/p" "$1" | sed -n 's/.*"kernels_compiled": \([0-9]*\).*/\1/p'
}

report() {  # file, arch, preset: a bench report with GPU timings (the plot's multiplot branch)
  cat >"$1" <<JSON
{"schema": "gmjit-bench/1", "preset": "$3", "arch": "$2",
 "phases": {"compile": {"seconds": 1.0}, "disk_hit": {"seconds": 0.01},
            "memory_hit": {"seconds": 0.000001}},
 "forward": {"ran": true, "tflops": 100.0}, "fwd_bwd": {"tflops": 90.0}}
JSON
}

bench=("$gmjit" bench --preset tiny --no-gpu)

case "$case_name" in
plot_runs_no_code_from_reports_or_paths)
  command -v gnuplot >/dev/null || { echo "skipped: gnuplot is not installed"; exit 77; }
  report "$work/evil.json" "x'; system 'touch $work/pwned-arch'; print '" tiny
  expect_failure "'$work/evil.json': arch" "$gmjit" plot "$work/evil.json" -o "$work/e.png"
  [ ! -e "$work/pwned-arch" ] || fail "the report's arch ran a shell command"
  report "$work/evil2.json" sm_90a "x'; system 'touch $work/pwned-preset'; print '"
  expect_failure "'$work/evil2.json': preset" "$gmjit" plot "$work/evil2.json" -o "$work/e.png"
  [ ! -e "$work/pwned-preset" ] || fail "the report's preset ran a shell command"

  echo '{"schema": 1}' >"$work/empty.json"
  expect_failure "'$work/empty.json': phases.compile.seconds: expected a number" \
    "$gmjit" plot "$work/empty.json" -o "$work/e.png"

  report "$work/ok.json" sm_90a tiny
  odd="o.png'; system 'touch pwned-output'; print '"
  (cd "$work" && "$gmjit" plot ok.json -o "$odd" >/dev/null) || fail "plot -o \"$odd\""
  [ ! -e "$work/pwned-output" ] || fail "plot's output path ran a shell command"
  [ -s "$work/$odd" ] || fail "plot did not write \"$odd\""
  (cd "$work" && "$gmjit" plot ok.json -o "it's.png" >/dev/null) || fail "plot -o \"it's.png\""
  [ -s "$work/it's.png" ] || fail "plot did not write \"it's.png\""
  mkdir "$work/t'mp"
  TMPDIR="$work/t'mp" "$gmjit" plot "$work/ok.json" -o "$work/q.png" >/dev/null ||
    fail "plot with a quote in TMPDIR"

  odd="b.png'; system 'touch pwned-bench'; print '"
  (cd "$work" && "${bench[@]}" --plot "$odd" >"$work/out" 2>&1) || fail "bench: $(cat "$work/out")"
  [ ! -e "$work/pwned-bench" ] || fail "bench --plot's path ran a shell command"
  [ -s "$work/$odd" ] || fail "bench did not write \"$odd\""
  ;;

bench_fails_when_it_cannot_write_its_outputs)
  expect_refusal "--json '/nonexistent/dir/r.json'" "${bench[@]}" --json /nonexistent/dir/r.json
  expect_refusal "--plot '/nonexistent/dir/p.png'" "${bench[@]}" --plot /nonexistent/dir/p.png
  expect_refusal "--json '$work'" "${bench[@]}" --json "$work"
  report "$work/ok.json" sm_90a tiny
  expect_refusal "'/nonexistent/dir/p.png'" "$gmjit" plot "$work/ok.json" -o /nonexistent/dir/p.png
  if [ -w /dev/full ]; then  # the write itself fails (ENOSPC)
    expect_failure "--json '/dev/full'" "${bench[@]}" --json /dev/full
  fi
  # gnuplot missing when the plot is drawn: the report is still written, the run fails.
  expect_failure "--plot '$work/p.png'" env PATH=/nonexistent "${bench[@]}" \
    --json "$work/r.json" --plot "$work/p.png"
  [ -s "$work/r.json" ] || fail "the JSON report was not written before the plot failed"
  ;;

bench_rejects_non_positive_counts)
  expect_refusal "--repeats" "${bench[@]}" --repeats 0
  expect_refusal "--repeats" "${bench[@]}" --repeats -1
  expect_refusal "--steps" "${bench[@]}" --pattern recompute --steps -3
  expect_refusal "--steps" "${bench[@]}" --pattern recompute --steps 0
  expect_refusal "--steps requires --pattern" "${bench[@]}" --steps 3  # else silently ignored
  ;;

bench_measures_a_real_compile_and_a_real_disk_hit)
  # A relative --cache-dir and GMJIT_CACHE_READONLY: the phases still use a writable cache.
  (cd "$work" && GMJIT_CACHE_READONLY=1 "${bench[@]}" --cache-dir b1 --json r1.json \
    >"$work/out" 2>&1) || fail "relative --cache-dir: $(cat "$work/out")"
  [ -d "$work/b1" ] || fail "--cache-dir b1 was not used as $work/b1"
  [ "$(phase_kernels "$work/r1.json" compile)" -gt 0 ] || fail "compile phase: $(cat "$work/r1.json")"
  [ "$(phase_kernels "$work/r1.json" disk_hit)" = 0 ] || fail "disk-hit compiled: $(cat "$work/r1.json")"
  # GMJIT_CACHE_DISABLE, and NVRTC's own compile cache asked for (CUDA_CACHE_DISABLE=0): both
  # ignored, so that the compile phase is cold on a GPU machine too.
  GMJIT_CACHE_DISABLE=1 CUDA_CACHE_DISABLE=0 "${bench[@]}" --json "$work/r2.json" >"$work/out" 2>&1 ||
    fail "GMJIT_CACHE_DISABLE: $(cat "$work/out")"
  [ "$(phase_kernels "$work/r2.json" disk_hit)" = 0 ] || fail "disk-hit compiled: $(cat "$work/r2.json")"
  grep -qF "ignoring CUDA_CACHE_DISABLE=0" "$work/out" || fail "CUDA_CACHE_DISABLE=0 kept: $(cat "$work/out")"
  grep -qF '"nvrtc_own_cache": "off"' "$work/r2.json" || fail "no nvrtc_own_cache: $(cat "$work/r2.json")"
  # A warm --cache-dir: the compile phase would compile nothing; a partly warm one (the no-grad
  # forward's FC2 is the grad-enabled one's too) would time a compile with disk reads in it.
  (cd "$work" && expect_failure "--cache-dir" "${bench[@]}" --cache-dir b1)
  grep -qF "would not time a cold compile" "$work/err" || fail "warm --cache-dir: $(cat "$work/err")"
  (cd "$work" && expect_failure "--cache-dir" "${bench[@]}" --cache-dir b1 --grad)
  grep -qF "would not time a cold compile" "$work/err" || fail "partly warm: $(cat "$work/err")"
  # Sizes with a leading zero are decimal (CLI11 alone would read 0100 as octal 64).
  "${bench[@]}" --tokens-per-expert 0100 --json "$work/r3.json" >"$work/out" 2>&1 ||
    fail "--tokens-per-expert 0100: $(cat "$work/out")"
  grep -qF '"tokens_per_expert": 100' "$work/r3.json" || fail "0100 was not 100: $(cat "$work/r3.json")"
  grep -qF '"preset": "tiny-custom"' "$work/r3.json" || fail "an override kept the name: $(cat "$work/r3.json")"
  # Dropping the router probs is another layer too: a --reference entry of the preset is not it.
  "${bench[@]}" --no-probs --json "$work/r4.json" >"$work/out" 2>&1 || fail "--no-probs: $(cat "$work/out")"
  grep -qF '"preset": "tiny-custom"' "$work/r4.json" || fail "--no-probs kept the name: $(cat "$work/r4.json")"
  grep -qF '"router_probs": false' "$work/r4.json" || fail "--no-probs kept the probs: $(cat "$work/r4.json")"
  touch "$work/afile"
  expect_refusal "--cache-dir '$work/afile'" "${bench[@]}" --cache-dir "$work/afile"
  # A cache too small to keep the kernels: the disk-hit child compiles, which is no disk hit.
  expect_failure "disk-hit" env GMJIT_CACHE_MAXSIZE=1 "${bench[@]}"
  grep -qF "compiled" "$work/err" || fail "small cache: $(cat "$work/err")"
  ;;

bench_and_plot_leave_no_temporary_folder)
  mkdir "$work/tmp"
  export TMPDIR="$work/tmp"
  leftovers() { [ -z "$(ls -A "$work/tmp")" ] || fail "left behind after $1: $(ls -A "$work/tmp")"; }
  expect_failure "--hidden" "${bench[@]}" --hidden 100
  leftovers "--hidden 100"
  expect_failure "--arch" "${bench[@]}" --arch sm_99
  leftovers "--arch sm_99"
  expect_failure "--experts" "${bench[@]}" --experts -1
  leftovers "--experts -1"
  expect_failure "disk-hit" env GMJIT_CACHE_MAXSIZE=1 "${bench[@]}"  # fails after the compile
  leftovers "a failed disk-hit phase"
  if command -v gnuplot >/dev/null; then
    # A link planted under plot's old guessable name (gmjit-plot-<pid>) is not written through.
    report "$work/ok.json" sm_90a tiny
    mkdir "$work/victim"
    bash -c 'ln -s "$3" "$TMPDIR/gmjit-plot-$$" && exec "$0" plot "$1" -o "$2"' \
      "$gmjit" "$work/ok.json" "$work/p.png" "$work/victim" >/dev/null || fail "plot"
    [ -z "$(ls -A "$work/victim")" ] || fail "plot wrote through a planted link: $(ls "$work/victim")"
    find "$work/tmp" -mindepth 1 -maxdepth 1 ! -type l | grep -q . &&
      fail "plot left $(ls -A "$work/tmp")"
  fi
  ;;

bench_removes_its_folder_when_interrupted)
  # Ctrl-C (SIGINT) or SIGTERM while it compiles: the fresh cache folder goes too, and the exit
  # status is the signal's. Waits for the folder, so the signal lands mid-run.
  mkdir "$work/tmp"
  export TMPDIR="$work/tmp"
  for sig in INT TERM; do
    "$gmjit" bench --preset deepseek --no-gpu >"$work/out" 2>&1 &
    pid=$!
    for _ in $(seq 200); do
      [ -n "$(ls -A "$work/tmp")" ] && break
      sleep 0.01
    done
    [ -n "$(ls -A "$work/tmp")" ] || fail "no cache folder appeared: $(cat "$work/out")"
    kill -s "$sig" "$pid"
    status=0
    wait "$pid" || status=$?
    want=$((128 + $(kill -l "$sig")))
    [ "$status" -eq "$want" ] || fail "SIG$sig: exit $status, not $want"
    [ -z "$(ls -A "$work/tmp")" ] || fail "SIG$sig left $(ls -A "$work/tmp")"
  done
  ;;

bench_validates_reference_before_timing)
  expect_refusal "--reference '/nonexistent/ref.json'" "${bench[@]}" --reference /nonexistent/ref.json
  echo "not json" >"$work/bad.json"
  expect_refusal "--reference '$work/bad.json': not valid JSON" "${bench[@]}" --reference "$work/bad.json"
  echo '{"shape": "tiny"}' >"$work/obj.json"
  expect_refusal "--reference '$work/obj.json': expected a list" "${bench[@]}" \
    --reference "$work/obj.json"
  echo '[{"shape": "tiny", "forward_tflops": "fast"}]' >"$work/field.json"
  expect_refusal "[0].forward_tflops" "${bench[@]}" --reference "$work/field.json"
  ;;

compile_specs_excludes_preset_grad_and_recipe)
  echo '[{"experts": 4, "hidden": 256, "ffn": 128, "grad": "no_grad"}]' >"$work/s.json"
  export GMJIT_CACHE_DIR="$work/cache"
  expect_refusal "--recipe" "$gmjit" compile --specs "$work/s.json" --recipe fp8-block
  expect_refusal "--grad" "$gmjit" compile --specs "$work/s.json" --grad on
  expect_refusal "--preset" "$gmjit" compile --specs "$work/s.json" --preset tiny
  expect_refusal "--weight-grads" "$gmjit" compile --specs "$work/s.json" --weight-grads bf16
  expect_refusal "--grad off prepares no backward" "$gmjit" compile --preset tiny --grad off \
    --weight-grads bf16
  [ ! -e "$work/cache" ] || fail "a refused compile touched the cache"
  # --weight-grads both: the fp32 and the bf16 backward (what PyTorch's op runs) of a preset.
  "$gmjit" compile --preset tiny --grad on --weight-grads both >"$work/wg.txt" ||
    fail "compile --weight-grads both: $(cat "$work/wg.txt")"
  grep -q "bwd bf16" "$work/wg.txt" || fail "no bf16 backward: $(cat "$work/wg.txt")"
  grep -q "^3 plan(s)" "$work/wg.txt" || fail "expected 3 plans: $(cat "$work/wg.txt")"
  ;;

bench_rejects_recompute_with_a_non_bf16_recipe)
  expect_refusal "--recipe fp8-block" "${bench[@]}" --pattern recompute --recipe fp8-block
  ;;

bench_rejects_bad_layer_sizes_naming_the_option)
  expect_refusal "--experts" "${bench[@]}" --experts 0
  expect_refusal "--experts" "${bench[@]}" --experts -1
  expect_refusal "--experts" "${bench[@]}" --experts 99999999999999999999
  expect_refusal "--experts" "${bench[@]}" --experts 0x10
  expect_refusal "--experts" "${bench[@]}" --experts 5000
  expect_refusal "--hidden" "${bench[@]}" --hidden 0
  expect_refusal "--hidden" "${bench[@]}" --hidden 100
  expect_refusal "--ffn" "${bench[@]}" --ffn -8
  expect_refusal "--tokens-per-expert" "${bench[@]}" --tokens-per-expert -5
  expect_refusal "--tokens-per-expert" "${bench[@]}" --tokens-per-expert 0
  expect_refusal "--tokens-per-expert" "${bench[@]}" --tokens-per-expert 99999999999
  expect_refusal "--experts" "$gmjit" bench --child-disk-hit --arch sm_90a --experts 0
  ;;

plot_and_cache_errors_name_the_file)
  echo "not json" >"$work/bad.json"
  expect_refusal "'$work/bad.json': not valid JSON" "$gmjit" plot "$work/bad.json" -o "$work/p.png"
  echo "[1, 2]" >"$work/list.json"
  expect_refusal "'$work/list.json': expected a gmjit bench --json report" "$gmjit" plot \
    "$work/list.json" -o "$work/p.png"
  expect_refusal "import '$work': expected a bundle file, not a directory" \
    env GMJIT_CACHE_DIR="$work/c" "$gmjit" cache import "$work"
  ;;

bench_child_disk_hit_requires_arch)
  expect_refusal "--arch" "$gmjit" bench --child-disk-hit --preset tiny
  ;;

unknown_subcommand_is_named)
  expect_refusal "unknown subcommand 'bogus'" "$gmjit" bogus
  grep -qF "doctor, bench, compile, plot, cache" "$work/err" || fail "$(cat "$work/err")"
  ;;

bench_checks_arch_up_front)
  expect_refusal "--arch 'sm_99' is not supported" "${bench[@]}" --arch sm_99
  ;;

json_inputs_nested_deeply_are_refused_not_a_crash)
  # Arrays 100000 deep: showing one in a message by dumping it overflowed the stack (SIGSEGV).
  deep="$(printf '%*s' 100000 '' | tr ' ' '[')$(printf '%*s' 100000 '' | tr ' ' ']')"
  echo "$deep" >"$work/deep.json"
  expect_refusal "plot '$work/deep.json': expected a gmjit bench --json report (a JSON object), got an array of 1 item(s)" \
    "$gmjit" plot "$work/deep.json" -o "$work/p.png"
  echo "{\"phases\": {\"compile\": {\"seconds\": $deep}}}" >"$work/deep_field.json"
  expect_refusal "phases.compile.seconds: expected a number (a gmjit bench --json report), got an array" \
    "$gmjit" plot "$work/deep_field.json" -o "$work/p.png"
  expect_refusal "--reference '$work/deep.json': [0]: expected an object, got an array of 1 item(s)" \
    "${bench[@]}" --reference "$work/deep.json"
  echo "[{\"shape\": \"tiny\", \"torch\": $deep}]" >"$work/deep_ref.json"
  expect_refusal "[0].torch: expected a string, got an array" \
    "${bench[@]}" --reference "$work/deep_ref.json"
  ;;

json_numbers_beyond_double_name_the_file)
  echo '{"phases": {"compile": {"seconds": 1e400}}}' >"$work/big.json"
  expect_refusal "plot '$work/big.json': not valid JSON" "$gmjit" plot "$work/big.json" \
    -o "$work/p.png"
  echo '[{"shape": "tiny", "forward_tflops": 1e400}]' >"$work/big_ref.json"
  expect_refusal "--reference '$work/big_ref.json': not valid JSON" "${bench[@]}" \
    --reference "$work/big_ref.json"
  ;;

reference_layer_sizes_are_whole_numbers)
  # Compared with the layer only after the GPU timings: a string there threw a bare JSON
  # type_error then, a float past int64 did not convert.
  for field in 'experts="4"' 'hidden=256.5' 'ffn=true' 'tokens=1e30'; do
    echo "[{\"shape\": \"tiny\", \"${field%%=*}\": ${field#*=}}]" >"$work/ref.json"
    expect_refusal "--reference '$work/ref.json': [0].${field%%=*}: expected a whole number" \
      "${bench[@]}" --reference "$work/ref.json"
  done
  ;;

json_inputs_that_are_fifos_are_refused_without_waiting)
  mkfifo "$work/fifo"
  for command in "$gmjit compile --specs" "$gmjit plot" "${bench[*]} --reference"; do
    rc=0
    # shellcheck disable=SC2086  # the command's words
    timeout 20 $command "$work/fifo" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -ne 124 ] || fail "'$command FIFO' waited for a writer"
    [ "$rc" -ne 0 ] || fail "'$command FIFO' exited 0"
    grep -qF "'$work/fifo' is a FIFO (a pipe); expected a regular file" "$work/err" ||
      fail "'$command FIFO': $(cat "$work/err")"
  done
  expect_refusal "--specs: '$work' is a directory" "$gmjit" compile --specs "$work"
  expect_refusal "--specs '$work/missing.json': cannot open" "$gmjit" compile --specs \
    "$work/missing.json"
  ;;

bench_and_plot_refuse_empty_option_values)
  # An empty value passed for the option not given: --json '' wrote no report, exit 0.
  for option in --json --plot --cache-dir --activation --arch --reference; do
    expect_refusal "$option: expected a value, got an empty string" "${bench[@]}" "$option" ""
  done
  report "$work/ok.json" sm_90a tiny
  expect_refusal "--output: expected a value, got an empty string" "$gmjit" plot "$work/ok.json" \
    -o ""
  ;;

*)
  fail "unknown case"
  ;;
esac
echo "ok"
