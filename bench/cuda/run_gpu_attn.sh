#!/usr/bin/env bash
# The flash attention prefill kernel on the GPU machine, one call (archive `attn-head`, bench/gpu_prelude.sh): its
# tests, the whole-model checks with the FP16 and BF16 operand variants, bench_cuda_attn_prefill (both variants'
# times and NMSE against the decode kernel), the SASS MMA kinds. Carry [".carry/debs", ".carry/attn-head.tar",
# ".carry/attn-head.commit"].
set -u
source bench/gpu_prelude.sh
gpu_unpack_head attn-head
gpu_configure
gpu_build cuda_test_cuda_attn_prefill cuda_test_cuda_forward bench_cuda_attn_prefill
timeout 120 build/cuda_test_cuda_attn_prefill >"$OUT/attn_test.log" 2>&1
note "attn prefill tests (rc $?): $(grep -cE '^\[       OK' "$OUT/attn_test.log") OK, $(grep -cE '^\[  FAILED  \] [A-Z]' "$OUT/attn_test.log") failed ($(elapsed))"
grep -E "peaked softmax|Failure" -A3 "$OUT/attn_test.log" | head -20
grep -E "^attn prefill \[flash\] Hq=16" "$OUT/attn_test.log" | awk '{print $NF}' | sort -g | sed -n '1p;$p' | tr '\n' ' ' |
  sed 's/^/real-shape fp16 NMSE range: /'; echo
for mode in flash flash-bf16 decode; do
  line=$(FERN_ATTN_PREFILL=$mode timeout 120 build/cuda_test_cuda_forward --gtest_filter='*SmallSynth*' 2>&1 | grep -E "^synth small")
  note "whole model, attention $mode: $line"
done
timeout 120 build/cuda_test_cuda_forward >"$OUT/forward.log" 2>&1
note "cuda_test_cuda_forward (rc $?): $(grep -cE '^\[       OK' "$OUT/forward.log") OK ($(elapsed))"
timeout 150 build/bench/bench_cuda_attn_prefill >"$OUT/bench_attn.log" 2>&1
grep -E "^\|" "$OUT/bench_attn.log"
obj=$(find build -name "attn_prefill.cu.o" | head -1)
note "SASS MMA kinds in attn_prefill: $(cuobjdump -sass "$obj" | grep -oE 'HMMA\.[0-9A-Z.]+' | sort | uniq -c | tr '\n' ' ')"
note "registers: $(cuobjdump -res-usage "$obj" 2>&1 | grep -A1 attn_prefill_kernel | grep -oE 'REG:[0-9]+' | tr '\n' ' ')"
gpu_summary
