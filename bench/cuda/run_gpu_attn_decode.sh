#!/usr/bin/env bash
# The tensor-core decode attention (src/cuda/attn_decode_tc.cu) on the GPU machine, one call (archive `attnd-head`,
# bench/gpu_prelude.sh): the attention tests (both decode kernels against the CPU and a double-precision host
# reference), the whole-model checks on the default kernel, then bench_cuda_decode's attention mode (4K breakdown,
# split-K tables of both kernels, decode steps with both). Carry [".carry/debs", ".carry/attnd-head.tar",
# ".carry/attnd-head.commit"]. BUDGET (seconds, default 225) bounds the whole call.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head attnd-head
budget=${BUDGET:-225}
gpu_configure
gpu_build cuda_test_cuda_attn cuda_test_cuda_forward bench_cuda_decode
timeout 70 build/cuda_test_cuda_attn >"$OUT/attn_test.log" 2>&1
note "attn tests (rc $?): $(grep -cE '^\[       OK' "$OUT/attn_test.log") OK, failed: $(grep -E '^\[  FAILED  \] [A-Z]' "$OUT/attn_test.log" | awk '{print $4}' | sort -u | tr '\n' ' ') ($(elapsed))"
grep -E "Failure" -A4 "$OUT/attn_test.log" | head -24
for k in tc split; do
  note "kernel-level NMSE $k: $(grep -E "^attn decode kernel $k " "$OUT/attn_test.log" | awk '{print $NF}' | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
done
note "backend-level NMSE (all kernels): $(grep -E '^attn Hq=' "$OUT/attn_test.log" | awk '{print $NF}' | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
timeout 80 build/cuda_test_cuda_forward >"$OUT/forward.log" 2>&1
note "cuda_test_cuda_forward (rc $?): $(grep -cE '^\[       OK' "$OUT/forward.log") OK, failed: $(grep -E '^\[  FAILED  \] [A-Z]' "$OUT/forward.log" | awk '{print $4}' | sort -u | tr '\n' ' ') ($(elapsed))"
grep -iE "nmse|top-1|replay" "$OUT/forward.log" | head -12
obj=$(find build -name "attn_decode_tc.cu.o" | head -1)
note "registers: $(cuobjdump -res-usage "$obj" 2>&1 | grep -A1 attn_decode_tc_kernel | grep -oE 'REG:[0-9]+|STACK:[0-9]+' | tr '\n' ' ')"
left=$(( budget - $(date +%s) + gpu_start ))
[ $left -lt 20 ] && left=20
timeout $left build/bench/bench_cuda_decode attn >"$OUT/bench.log" 2>&1
note "bench_cuda_decode attn (rc $?, limit $left s) ($(elapsed))"
grep -iE "attn|attention|combine|context|^ +[0-9]+ " "$OUT/bench.log" | head -60
gpu_summary
