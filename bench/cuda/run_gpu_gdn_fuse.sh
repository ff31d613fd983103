#!/usr/bin/env bash
# One GPU call (~6 minutes): a GDN mixer's input projections and step as one launch (FERN_CUDA_GDN_FUSE=1,
# cuda::gdn_proj_step; docs/notes/cuda-decode-v39-gdn-fused.md) against the two launches. Its whole-model test first
# under a short timeout (a broken handoff hangs, it does not fail), then the step kernel's own tests (its body moved
# to gdn_step.cuh), then the 4K decode step's timeline under each value, then `fern bench` decode at GF_LENGTHS
# (default 4096,131072) with FERN_CUDA_GDN_FUSE=0,1 in one process. From the repository root; carry [".carry/debs"]
# (and .carry/tl-head.tar / .commit to build an archived commit, bench/gpu_prelude.sh). Files under $OUT.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head tl-head
gpu_configure
gpu_build fern bench_cuda_decode cuda_test_cuda_forward cuda_test_cuda_gdn
timeout 150 build/cuda_test_cuda_forward --gtest_filter=CudaForward.FusedGdnMixerSameLogits >"$OUT/t_fuse.log" 2>&1
note "FusedGdnMixerSameLogits rc $? ($(elapsed))"
grep -E "Failure|Expected|Which|real-width|fused mixers" "$OUT/t_fuse.log" | head -12
grep -q '^\[  PASSED' "$OUT/t_fuse.log" || { gpu_summary; exit 1; }
timeout 200 build/cuda_test_cuda_gdn >"$OUT/t_gdn.log" 2>&1
note "cuda_test_cuda_gdn rc $?: $(grep -c '^\[       OK' "$OUT/t_gdn.log") OK ($(elapsed))"
timeout 200 build/cuda_test_cuda_forward --gtest_filter='CudaForward.LeanGdnKernelSameLogits:CudaForward.RandomModelMatchesCpu:CudaForward.MoeRouterFoldMatchesCpu' \
  >"$OUT/t_fwd.log" 2>&1
note "CudaForward (lean, random, fold) rc $?: $(grep -c '^\[       OK' "$OUT/t_fwd.log") OK ($(elapsed))"
for v in 0 1; do
  FERN_CUDA_GDN_FUSE=$v timeout 60 build/bench/bench_cuda_decode timeline 4096 9 >"$OUT/tl_fuse$v.log" 2>&1
  note "[FERN_CUDA_GDN_FUSE=$v] rc $?: $(grep -m1 '^step:' "$OUT/tl_fuse$v.log" | cut -c1-60)"
  grep -E '^(linear_kernel|gdn_kernel)' "$OUT/tl_fuse$v.log" | head -8
done
gpu_decode_switch FERN_CUDA_GDN_FUSE=0,1 "${GF_LENGTHS:-4096,131072}" 300
gpu_summary
