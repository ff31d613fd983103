#!/usr/bin/env bash
# One GPU call (~3 minutes): the opt-in lm_head ring (src/cuda/linear_ring.cu, docs/notes/cuda-decode-v37-head-ring.md)
# against the register-load tensor-core kernel. Its test first under a short timeout (a pipeline bug hangs, it does
# not fail), then the 4K decode step's timeline once per fill form, then `fern bench` decode at HR_LENGTHS (default
# 4096) with FERN_CUDA_HEAD_RING=0,1 in one process; also bench_cuda_reduce (docs/notes/cuda-decode-v38-reduce.md:
# seconds). From the repository root; carry [".carry/debs"] (and
# .carry/tl-head.tar / .commit to build an archived commit, bench/gpu_prelude.sh). Files under $OUT.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head tl-head
gpu_configure
gpu_build fern bench_cuda_decode bench_cuda_reduce cuda_test_cuda_linear
timeout 60 build/bench/bench_cuda_reduce >"$OUT/reduce.md" 2>&1
note "bench_cuda_reduce rc $? ($(elapsed))"
cat "$OUT/reduce.md"
timeout 90 build/cuda_test_cuda_linear --gtest_filter=CudaLinear.BulkCopyRing >"$OUT/t_ring.log" 2>&1
note "BulkCopyRing rc $? ($(elapsed))"
grep -E "Failure|Expected|Which|ring lm_head" "$OUT/t_ring.log" | head -12
grep -q '^\[  PASSED' "$OUT/t_ring.log" || { gpu_summary; exit 1; }
for set in "FERN_CUDA_HEAD_RING=0" "FERN_CUDA_HEAD_RING=1" "FERN_CUDA_HEAD_RING=1 FERN_CUDA_HEAD_RING_TILES=2" \
  "FERN_CUDA_HEAD_RING=1 FERN_CUDA_HEAD_RING_COPY=rows" "FERN_CUDA_HEAD_RING=1 FERN_CUDA_HEAD_RING_STAGES=4"; do
  tag=$(echo "$set" | tr -c 'A-Za-z0-9\n' '_')
  # shellcheck disable=SC2086  # a set is several assignments
  env $set timeout 60 build/bench/bench_cuda_decode timeline 4096 9 >"$OUT/tl_$tag.log" 2>&1
  note "[$set] rc $?: $(grep -m1 '^step:' "$OUT/tl_$tag.log" | cut -c1-48) | $(grep -m1 -E '^(linear_ring|linear_tc)' "$OUT/tl_$tag.log" | awk '{print $1, $NF}')"
done
gpu_decode_switch FERN_CUDA_HEAD_RING=0,1 "${HR_LENGTHS:-4096}" 200
gpu_summary
