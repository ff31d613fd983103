#!/usr/bin/env bash
# A decode switch compared in one process (fern bench --decode-switch: the values interleaved run by run), with the
# tests that guard it, on the GPU machine from the repository root. Carry [".carry/debs", ".carry/sw-head.tar",
# ".carry/sw-head.commit"] (bench/gpu_prelude.sh says how to make the archive). Knobs:
#   SW_SWITCH   NAME=v1,v2,...              (required)
#   SW_LENGTHS  decode contexts             (default 4096,131072)
#   SW_RUNS     runs per value              (default 3)
#   SW_TESTS    CUDA test binaries to run first, each once plainly and once under every SW_TEST_ENV assignment
#   SW_TEST_ENV "VAR=VALUE ..."             (default none)
#   SW_PREFILL  prefill lengths for a last `fern bench --phase prefill` (default none), SW_PREFILL_RUNS (3)
#   SW_SASS     "file.cu:REGEX ..."          count SASS lines matching REGEX in that object (cuobjdump)
# Logs under $OUT; a summary last.
set -u
BUDGET=${BUDGET:-500}
source bench/gpu_prelude.sh
left() { echo $(( BUDGET - ($(date +%s) - gpu_start) )); }
gpu_unpack_head sw-head
gpu_configure
gpu_build fern ${SW_TESTS:-}
for spec in ${SW_SASS:-}; do
  f=${spec%%:*}; re=${spec#*:}
  n=$(/usr/local/cuda/bin/cuobjdump -sass "build/CMakeFiles/fern_cuda.dir/src/cuda/$f.o" 2>/dev/null | grep -cE "$re")
  note "SASS $f /$re/: $n lines"
done
for t in ${SW_TESTS:-}; do
  for e in "" ${SW_TEST_ENV:-}; do
    if [ -z "$e" ]; then r=$(timeout 200 "build/$t" 2>&1); else r=$(env "$e" timeout 200 "build/$t" 2>&1); fi
    rc=$?
    printf "%s\n" "== $t ${e:-(defaults)} rc $rc" "$r" >>"$OUT/tests.log"
    note "$t ${e:-(defaults)}: rc $rc, $(printf "%s\n" "$r" | grep -c '^\[       OK') OK, $(printf "%s\n" "$r" | grep -c '^\[  FAILED') FAILED lines ($(elapsed))"
  done
done
grep -B3 -A8 "Failure" "$OUT/tests.log" 2>/dev/null | head -30
grep -E "^(synth small|chunk |random)" "$OUT/tests.log" 2>/dev/null | head -20
if [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 20 )) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode \
    --lengths "${SW_LENGTHS:-4096,131072}" --runs "${SW_RUNS:-3}" \
    --decode-switch "${SW_SWITCH:?set SW_SWITCH=NAME=v1,v2,...}" --json "$OUT/decode_switch.json" \
    >"$OUT/decode_switch.log" 2>&1
  note "decode switch rc $? ($(elapsed))"
  grep -E "^\|" "$OUT/decode_switch.log"
fi
if [ -n "${SW_PREFILL:-}" ] && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 10 )) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
    --lengths "$SW_PREFILL" --runs "${SW_PREFILL_RUNS:-3}" --json "$OUT/prefill.json" >"$OUT/prefill.log" 2>&1
  note "prefill rc $? ($(elapsed)): $(grep -oE "prefill [0-9]+: [0-9.]+ tok/s" "$OUT/prefill.log" | tr "\n" " ")"
  grep -E "^\|" "$OUT/prefill.log" | tail -4
fi
gpu_summary
