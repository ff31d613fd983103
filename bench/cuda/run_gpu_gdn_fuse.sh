#!/usr/bin/env bash
# One GPU call (~7 minutes): a GDN mixer's input projections and step as one launch (cuda::gdn_proj_step,
# docs/notes/cuda-decode-v39-gdn-fused.md) in its three forms (FERN_CUDA_GDN_FUSE=1: the step blocks request their
# state after their rows; 2: into shared memory at the launch's start; both at 72 registers; 3: as 2 at 80) against
# the two launches (0). The whole-model test first under a short timeout (a broken handoff hangs, it does not
# fail), then the step kernel's tests (its body moved to gdn_step.cuh), the 4K decode step's timeline under each
# value, `fern bench` decode with --decode-switch FERN_CUDA_GDN_FUSE=0,1,2,3, one process per length of GF_LENGTHS
# (default "4096 131072"), then compute-sanitizer memcheck of the fused forms' test. From the repository root; carry
# [".carry/debs"] (and .carry/tl-head.tar / .commit to build an archived commit, bench/gpu_prelude.sh). Files under
# $OUT.
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
timeout 120 build/cuda_test_cuda_forward --gtest_filter=CudaForward.LeanGdnKernelSameLogits >"$OUT/t_lean.log" 2>&1
note "LeanGdnKernelSameLogits rc $? ($(elapsed))"
for v in 0 1 2 3; do
  # the per-position table too (start lag, duration, advance of every launch): out_proj's lag after the fused launch
  # says whether its blocks still became resident early (notes v39 section 2, registers)
  FERN_CUDA_GDN_FUSE=$v timeout 60 build/bench/bench_cuda_decode timeline 4096 9 "$OUT/tl_pos$v.txt" >"$OUT/tl_fuse$v.log" 2>&1
  note "[FERN_CUDA_GDN_FUSE=$v] rc $?: $(grep -m1 '^step:' "$OUT/tl_fuse$v.log" | cut -c1-60)"
  grep -E '^(linear_kernel|gdn_kernel|gdn_proj_kernel)' "$OUT/tl_fuse$v.log" | head -8
done
for len in ${GF_LENGTHS:-4096 131072}; do  # one process per length: a length cut off by the call's limit loses only itself
  gpu_decode_switch FERN_CUDA_GDN_FUSE=0,1,2,3 "$len" 240 "decode_$len"
done
# compute-sanitizer memcheck of the fused forms' test (GF_MEMCHECK=0 skips it), last: it has the call's leftover time.
if [ "${GF_MEMCHECK:-1}" = 1 ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 build/cuda_test_cuda_gdn \
    --gtest_filter=CudaGdn.FusedProjectionsAndStepSameBits >"$OUT/memcheck.log" 2>&1
  note "memcheck (fused forms) rc $?: $(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log") ($(elapsed))"
fi
gpu_summary
