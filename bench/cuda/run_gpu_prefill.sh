#!/usr/bin/env bash
# One GPU call for the prefill work (docs/notes/cuda-prefill-v1.md), from the repository root with carry
# [".carry/debs"]: build fern, the CUDA tests and benches; run every CUDA test; the prefill linear micro-benchmark;
# `fern bench --phase prefill` on the full-size synthetic model. Logs under $OUT, a summary last.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(git rev-parse --short=12 HEAD 2>/dev/null)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
targets="fern bench_cuda_prefill_linear $(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_]*' | sort -u | tr '\n' ' ')"
ninja -C build -j16 $targets >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
note "build: $(( $(date +%s) - start )) s"
fails=""
for t in build/cuda_test_*; do
  [ -x "$t" ] || continue
  timeout 100 "$t" >>"$OUT/tests.log" 2>&1 || fails+=" $(basename "$t")"
done
note "CUDA tests: $(grep -c '^\[       OK' "$OUT/tests.log") OK, failed:${fails:- none} ($(( $(date +%s) - start )) s)"
grep -E "^(gemm|backend|linear|random|bf16 model|synth small)" "$OUT/tests.log" | head -60
grep -B3 -A8 "FAILED\|Failure" "$OUT/tests.log" | head -40
timeout 40 build/bench/bench_cuda_prefill_linear 2>&1 | tee "$OUT/bench_linear.md"
timeout 90 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill --lengths 256,1024,4096 --runs 2 \
  >"$OUT/bench_prefill.log" 2>&1
tail -12 "$OUT/bench_prefill.log"
note "total $(( $(date +%s) - start )) s"
echo "== SUMMARY"; printf "%s" "$summary"
