#!/usr/bin/env bash
# One GPU call that compares two builds of one commit that differ only in CUDA compile flags: A (the defaults)
# and B (AB_FLAGS_B, e.g. "-DFERN_L2_EVICT_FIRST=0"), built side by side, then `fern bench` decode at AB_LENGTHS
# (default 4096,131072; median of 3) run AB_ROUNDS times in turn (A, B, A, B, ...: drift hits both alike), and the
# decode timeline (bench_cuda_decode timeline) of each at AB_TL_CONTEXT (default 131072). AB_TESTS (test
# executables) run on A first. From the repository root with carry [".carry/debs", ".carry/ab-head.tar",
# ".carry/ab-head.commit"]; files under $OUT, a table last.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head ab-head
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $GPU_COMMIT; B: ${AB_FLAGS_B:-}"
TESTS=${AB_TESTS:-}
build() {  # dir, extra CUDA flags, targets
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real -DFERN_GIT_COMMIT="$GPU_COMMIT" \
    -DCMAKE_CUDA_FLAGS="$2" >"$OUT/cmake_$(basename "$1").log" 2>&1 &&
    ninja -C "$1" -k 0 -j8 "${@:3}" >"$OUT/build_$(basename "$1").log" 2>&1
}
build build_a "" fern bench_cuda_decode $TESTS &
build build_b "${AB_FLAGS_B:-}" fern bench_cuda_decode &
wait
for v in a b; do note "build $v: $(grep -cE 'FAILED|error:' "$OUT/build_build_$v.log") error lines ($(elapsed))"; done
for t in $TESTS; do
  timeout 300 "build_a/$t" >"$OUT/$t.log" 2>&1
  note "$t rc $?: $(grep -c '^\[       OK' "$OUT/$t.log") OK, $(grep -c '^\[  FAILED' "$OUT/$t.log") FAILED lines"
done
if [ "${AB_SASS:-1}" = 1 ]; then  # the streaming loads of the GEMV and the attention's KV copies, as built
  for v in a b; do
    o=build_$v/CMakeFiles/fern_cuda.dir/src/cuda
    cuobjdump -sass "$o/linear.cu.o" | grep -m2 -E "LDG.*128" | sed "s/^ */SASS $v linear: /"
    cuobjdump -sass "$o/attn_decode_tc.cu.o" | grep -m1 LDGSTS | sed "s/^ */SASS $v attn: /"
  done
fi
for r in $(seq "${AB_ROUNDS:-2}"); do
  for v in a b; do
    timeout 200 "build_$v/fern" bench --synth qwen3.6-35b-a3b --backend cuda --phase decode \
      --lengths "${AB_LENGTHS:-4096,131072}" --runs 3 >"$OUT/decode_${v}_$r.md" 2>"$OUT/decode_${v}_$r.err"
    note "decode $v round $r: $(grep -E '^\| [0-9]' "$OUT/decode_${v}_$r.md" | awk -F'|' '{printf "%s: %s tok/s; ", $2, $3}') ($(elapsed))"
  done
done
for v in a b; do
  timeout 120 "build_$v/bench/bench_cuda_decode" timeline "${AB_TL_CONTEXT:-131072}" 9 "$OUT/timeline_$v.txt" \
    >"$OUT/timeline_$v.log" 2>&1
  note "timeline $v: $(grep '^step:' "$OUT/timeline_$v.log")"
  grep -E "^(moe|linear|gdn|attn)" "$OUT/timeline_$v.log" | head -12
done
tar -C "$OUT" -czf "$OUT/ab.tar.gz" $(cd "$OUT" && ls timeline_* decode_* *.log 2>/dev/null) &&
  (cd "$OUT" && rm -f timeline_* decode_* cmake_*.log build_*.log cuda_test*.log)
gpu_summary
