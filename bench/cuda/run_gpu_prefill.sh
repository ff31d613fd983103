#!/usr/bin/env bash
# One GPU call for the prefill kernels (docs/notes/cuda-prefill-v1.md, cuda-prefill-v2-{moe,gdn,attn}.md), from the
# repository root with carry [".carry/debs", ".carry/prefill-head.tar", ".carry/prefill-head.commit"] (the archive
# of the commit to test, bench/gpu_prelude.sh says how): build fern, every CUDA test and the prefill
# micro-benchmarks; run every CUDA test; the micro-benchmarks (dense GEMM, MoE block, GDN core, attention core);
# `fern bench --phase prefill` on the full-size synthetic model (PREFILL_LENGTHS, default 512,2048,4096). Logs under
# $OUT, a summary last.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head prefill-head
gpu_configure
gpu_build fern bench_cuda_prefill_linear bench_cuda_moe_prefill bench_cuda_gdn_prefill bench_cuda_attn_prefill \
  $(gpu_cuda_test_targets)
gpu_run_cuda_tests
grep -E "^(moe prefill|gdn|attn prefill|peaked|chunk )" "$OUT/cuda_tests.log" | cut -c1-160 | head -80
for b in prefill_linear moe_prefill gdn_prefill attn_prefill; do
  timeout 60 build/bench/bench_cuda_$b >"$OUT/bench_$b.md" 2>&1
  note "bench_cuda_$b rc $? ($(elapsed))"
  cat "$OUT/bench_$b.md"
done
timeout 240 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
  --lengths "${PREFILL_LENGTHS:-512,2048,4096}" --runs 2 --json "$OUT/prefill.json" >"$OUT/bench_prefill.log" 2>&1
grep -E "^\|" "$OUT/bench_prefill.log" | tail -6
note "fern bench prefill: $(grep -oE "prefill [0-9]+: [0-9.]+ tok/s" "$OUT/bench_prefill.log" | tr "\n" " ")"
note "total $(elapsed)"
gpu_summary
