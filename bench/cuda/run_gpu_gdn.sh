#!/usr/bin/env bash
# One GPU call for the Gated DeltaNet prefill's two forms of the delta rule (docs/notes/cuda-prefill-v4-gdn.md),
# from the repository root with carry [".carry/debs", ".carry/gdn-head.tar", ".carry/gdn-head.commit"] (the archive
# of the commit to test, bench/gpu_prelude.sh says how): build fern, the GDN prefill test, the whole-model tests
# (forward, chunked prefill) and the GDN micro-benchmark; run the GDN test (both forms against the CPU), a memcheck
# of the chunked form's direct tests, the micro-benchmark (scan vs chunked per T), the whole-model tests (their
# default FERN_GDN_PREFILL=auto), then `fern bench --phase prefill` at 4,096 rows with each FERN_GDN_PREFILL value
# in GDN_FORMS (default "scan chunked": each run synthesises the full-size model, ~30 s; add auto and rows when
# the device time allows). Logs under $OUT; the summary, then the micro-benchmark's table last.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head gdn-head
gpu_configure
gpu_build fern cuda_test_cuda_gdn_prefill cuda_test_cuda_forward cuda_test_cuda_prefill_chunks bench_cuda_gdn_prefill
timeout 120 build/cuda_test_cuda_gdn_prefill >"$OUT/test_gdn.log" 2>&1
note "cuda_test_cuda_gdn_prefill rc $? ($(grep -c '^\[       OK' "$OUT/test_gdn.log") OK) ($(elapsed))"
grep -B2 -A6 "Failure" "$OUT/test_gdn.log" | head -40
grep -E "^gdn " "$OUT/test_gdn.log" | cut -c1-200
timeout 60 build/bench/bench_cuda_gdn_prefill >"$OUT/bench_gdn_prefill.md" 2>&1
note "bench_cuda_gdn_prefill rc $? ($(elapsed))"
for t in forward prefill_chunks; do
  timeout 90 build/cuda_test_cuda_$t >"$OUT/test_$t.log" 2>&1
  note "cuda_test_cuda_$t rc $? ($(grep -c '^\[       OK' "$OUT/test_$t.log") OK) ($(elapsed))"
  grep -B2 -A6 "Failure" "$OUT/test_$t.log" | head -20
done
if command -v compute-sanitizer >/dev/null; then
  timeout 60 compute-sanitizer --tool memcheck build/cuda_test_cuda_gdn_prefill --gtest_filter='*ChunkedDirect*' \
    >"$OUT/memcheck_gdn.log" 2>&1
  note "memcheck ChunkedDirect rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_gdn.log" | tail -1)"
fi
for form in ${GDN_FORMS:-scan chunked}; do
  FERN_GDN_PREFILL=$form timeout 60 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
    --lengths 4096 --runs 2 >"$OUT/bench_prefill_$form.log" 2>&1
  note "fern bench prefill FERN_GDN_PREFILL=$form rc $?: $(grep -oE "prefill [0-9]+: [0-9.]+ tok/s" \
    "$OUT/bench_prefill_$form.log" | tr "\n" " ") ($(elapsed))"
done
note "total $(elapsed)"
gpu_summary
cat "$OUT/bench_gdn_prefill.md"
