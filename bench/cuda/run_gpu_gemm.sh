#!/usr/bin/env bash
# One GPU call for the prefill tile loops (docs/notes/cuda-prefill-v3-gemm.md, -v4-wg.md), from the repository root with
# carry [".carry/debs", ".carry/gemm-head.tar", ".carry/gemm-head.commit"] (the archive of the commit to test,
# bench/gpu_prelude.sh says how): build fern, the two GEMM micro-benchmarks and the tests that cover the GEMMs and
# the whole model; confirm the instructions (cuobjdump); run the tests, the micro-benchmarks (both tile loops) and
# `fern bench --phase prefill` on the full-size synthetic model. The whole-model tests run twice: on the default
# tile loop (wg on the H200) and with FERN_GEMM=$GEMM_ALT (default split; none: only once). GEMM_STEPS=short: no
# fern CLI and no `fern bench`. A first quick check (the GEMM test's mode test and one real shape, 60 s at most) stops
# the call early when the loops fail or hang, so that a deadlock does not eat the device time.
# Every step continues past a failure; logs under $OUT, a summary last.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head gemm-head
gpu_configure
TESTS="cuda_test_cuda_linear_gemm cuda_test_cuda_moe_prefill cuda_test_cuda_forward cuda_test_cuda_prefill_chunks"
STEPS=${GEMM_STEPS:-full}
ALT=${GEMM_ALT:-split}
if [ "$STEPS" = short ]; then gpu_build bench_cuda_prefill_linear bench_cuda_moe_prefill $TESTS
else gpu_build fern bench_cuda_prefill_linear bench_cuda_moe_prefill $TESTS; fi

# The instructions of the tile loops: HMMA (mma.sync) in the older loops, HGMMA (wgmma) in the wg kernels; spills.
for o in linear_gemm moe_prefill_f16 linear_gemm_wg moe_prefill_wg; do
  obj=build/CMakeFiles/fern_cuda.dir/src/cuda/$o.cu.o
  sass=/tmp/sass_$o.txt  # not under $OUT: only a few files come back
  cuobjdump -sass "$obj" >"$sass" 2>&1
  note "sass $o: $(grep -c 'HMMA.16816.F32 ' "$sass") HMMA.16816.F32 (f16), $(grep -c 'HMMA.16816.F32.BF16' "$sass") HMMA.16816.F32.BF16, $(grep -c 'LDSM' "$sass") LDSM, $(grep -c 'LDGSTS' "$sass") LDGSTS, $(grep -c 'HGMMA' "$sass") HGMMA"
  cuobjdump --dump-resource-usage "$obj" 2>&1 | grep -E "REG|Function" | paste - - | grep -E "16_kernel|wg_kernel" |
    sed -E 's/.*Function ([^:]*):.*REG:([0-9]+).*STACK:([0-9]+).*/\1 REG \2 STACK \3/' | cut -c1-140 >>/tmp/regs.txt
done
cat /tmp/regs.txt

timeout 60 build/cuda_test_cuda_linear_gemm --gtest_filter='CudaGemmMode.*:CudaLinearGemm.RowsOfVeryDifferentMagnitude' \
  >"$OUT/quick_check.log" 2>&1
rc=$?
note "quick check rc $rc ($(elapsed)): $(grep -c '^\[       OK' "$OUT/quick_check.log") OK"
if [ $rc -ne 0 ]; then
  tail -30 "$OUT/quick_check.log"
  note "quick check failed: stopping here"
  gpu_summary
  exit 1
fi

GPU_TEST_FAILS=""
for t in $TESTS; do
  timeout 150 "build/$t" >"$OUT/$t.log" 2>&1 || GPU_TEST_FAILS+=" $t"
  note "$t: $(grep -c '^\[       OK' "$OUT/$t.log") OK, $(grep -c '^\[  FAILED' "$OUT/$t.log") FAILED lines ($(elapsed))"
  grep -B2 -A6 "Failure" "$OUT/$t.log" | head -30
done
for t in cuda_test_cuda_forward cuda_test_cuda_prefill_chunks; do
  [ "$ALT" = none ] && break
  log=/tmp/${t}_$ALT.log
  FERN_GEMM=$ALT timeout 150 "build/$t" >"$log" 2>&1 || GPU_TEST_FAILS+=" ${t}(FERN_GEMM=$ALT)"
  note "$t FERN_GEMM=$ALT: $(grep -c '^\[       OK' "$log") OK, $(grep -c '^\[  FAILED' "$log") FAILED lines"
  grep -hE "^(random|bf16 model|synth|chunk)" "$log" | sed "s/^/$ALT: /" | cut -c1-170
done
note "tests failed:${GPU_TEST_FAILS:- none}"
grep -hE "^(gemm|backend linear|moe prefill .*(default|fp16|tile 64,|tile 16,)|random|bf16 model|synth|chunk)" \
  "$OUT"/cuda_test_cuda_{linear_gemm,moe_prefill,forward,prefill_chunks}.log | cut -c1-170 | head -120 \
  >/tmp/test_lines.txt
grep -E "^(gemm (split|wg) (in_proj|qkv|magn)|backend linear dispatch qkv|moe prefill real, (split|wg|default)|synth|chunk)" \
  /tmp/test_lines.txt | cut -c1-150

for b in prefill_linear moe_prefill; do
  timeout 90 build/bench/bench_cuda_$b >"$OUT/bench_$b.md" 2>&1
  note "bench_cuda_$b rc $? ($(elapsed))"
done
grep -E "^\| (shape|gdn|out_proj|expert)" "$OUT/bench_prefill_linear.md"
grep -E "^\| (T \||512|2048)" "$OUT/bench_moe_prefill.md"

[ "$STEPS" = short ] && { note "total $(elapsed)"; gpu_summary; exit 0; }
timeout 150 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
  --lengths "${PREFILL_LENGTHS:-4096,32768}" --runs 2 --json "$OUT/prefill.json" >"$OUT/bench_prefill.log" 2>&1
note "fern bench prefill rc $?: $(grep -oE "prefill [0-9]+: [0-9.]+ tok/s" "$OUT/bench_prefill.log" | tr "\n" " ")"
grep -E "^\|" "$OUT/bench_prefill.log" | tail -6
note "total $(elapsed)"
# The table last: dense qkv at 2048/4096 rows and the MoE block at T = 2048, each loop.
grep -E "gdn in_proj_qkv 8192x2048 \| (2048|4096)|out_proj 2048x4096 \| 2048|expert-size 512x2048 \| 2048" "$OUT/bench_prefill_linear.md"
grep -E "^\| (512|2048) \| grouped, (default|FERN_GEMM=split|FERN_GEMM_WG_PIPE)" "$OUT/bench_moe_prefill.md"
gpu_summary
