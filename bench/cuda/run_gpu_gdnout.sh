#!/usr/bin/env bash
# One GPU call for the decode GDN mixer without the gated-norm round trips (docs/notes/cuda-decode-v8-gdn.md), from
# the repository root with carry [".carry/debs", ".carry/gdnout-head.tar", ".carry/gdnout-head.commit"] (the
# archive of the commit to test, bench/gpu_prelude.sh says how): build fern, the GDN, GEMV and whole-model tests
# and bench_cuda_decode; run the tests (the GDN step, the fused gated-norm GEMV, the plain GEMV, the whole model),
# `bench_cuda_decode blocks` (the 4K step by block, with the unfused form as a row), then `fern bench --phase
# decode` on the full-size synthetic model at 4K and 128K. Logs under $OUT, a summary last.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head gdnout-head
gpu_configure
gpu_build fern cuda_test_cuda_gdn cuda_test_cuda_linear_gated_norm cuda_test_cuda_linear cuda_test_cuda_forward \
  bench_cuda_decode
for t in gdn linear_gated_norm linear forward; do
  timeout 90 build/cuda_test_cuda_$t >"$OUT/test_$t.log" 2>&1
  note "cuda_test_cuda_$t rc $? ($(grep -c '^\[       OK' "$OUT/test_$t.log") OK) ($(elapsed))"
  grep -B2 -A8 "Failure" "$OUT/test_$t.log" | head -30
done
FERN_CUDA_GNORM_WIDE=1 timeout 60 build/cuda_test_cuda_forward >"$OUT/test_forward_gnorm_wide.log" 2>&1
note "cuda_test_cuda_forward with FERN_CUDA_GNORM_WIDE=1 rc $? ($(grep -c '^\[       OK' "$OUT/test_forward_gnorm_wide.log") OK) ($(elapsed))"
grep -hE "^(random|graph)" "$OUT/test_forward_gnorm_wide.log" | cut -c1-170
grep -hE "^(gdn|gated_norm_linear|random|  prefill|bf16 model|synth|graph)" "$OUT"/test_gdn.log \
  "$OUT"/test_linear_gated_norm.log "$OUT"/test_forward.log | cut -c1-170 | head -60
timeout 70 build/bench/bench_cuda_decode blocks >"$OUT/bench_blocks.md" 2>&1
note "bench_cuda_decode blocks rc $? ($(elapsed))"
grep -E "GDN|gdn|out_proj|unfused|GNORM|GEMV_WIDE=1|step kernel|attention mixer|MoE block|lm_head|sum of" "$OUT/bench_blocks.md" | head -20
timeout 150 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 --runs 3 \
  >"$OUT/bench_decode.log" 2>&1
note "fern bench decode rc $?: $(grep -E "^\| [0-9]+ " "$OUT/bench_decode.log" | cut -d"|" -f2,3 | tr "\n" " ") ($(elapsed))"
grep -E "^\|" "$OUT/bench_decode.log" | tail -6
FERN_CUDA_GNORM_WIDE=1 timeout 60 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode \
  --lengths 4096 --runs 3 >"$OUT/bench_decode_gnorm_wide.log" 2>&1
note "fern bench decode FERN_CUDA_GNORM_WIDE=1 rc $?: $(grep -E "^\| [0-9]+ " \
  "$OUT/bench_decode_gnorm_wide.log" | cut -d"|" -f2,3 | tr "\n" " ") ($(elapsed))"
note "total $(elapsed)"
gpu_summary
