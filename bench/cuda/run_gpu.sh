#!/usr/bin/env bash
# One GPU-machine session for the CUDA backend: build the CUDA tests and the benchmark, run the tests, dump the
# GEMV kernel's SASS instruction mix, run the benchmark, print a short summary. Logs go to $OUT.
# Usage (from the repository root, with carry [".carry"]): bash bench/cuda/run_gpu.sh [tests|bench|all]
set -u
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source tools/gpu-env.sh
# The carried packages lack brotli's pkg-config files, which cpp-httplib's .pc requires; the CUDA targets do not
# link the HTTP server, so empty stand-ins are enough for the configure step.
stub=/tmp/fern-pc-stubs
mkdir -p $stub
for m in libbrotlicommon libbrotlidec libbrotlienc; do
  printf 'Name: %s\nDescription: stand-in for configuring\nVersion: 1.0.9\nLibs:\nCflags:\n' $m >$stub/$m.pc
done
export PKG_CONFIG_PATH="$PKG_CONFIG_PATH:$stub"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
tests="cuda_test_cuda_linear cuda_test_cuda_misc cuda_test_cuda_gdn cuda_test_cuda_attn cuda_test_cuda_moe cuda_test_cuda_forward"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA=ON -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 ||
  { tail -20 "$OUT/cmake.log"; exit 1; }
ninja -C build -j16 $tests bench_cuda_decode >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
summary=""
if [ "$what" != bench ]; then
  for t in $tests; do
    timeout 200 ./build/$t >"$OUT/$t.log" 2>&1
    rc=$?
    summary+="$t rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"$'\n'
    grep -E "NMSE|top-1|graph replay|Failure|Expected|Which is|actual" "$OUT/$t.log" | head -40
  done
  if command -v compute-sanitizer >/dev/null; then
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/cuda_test_cuda_forward \
      --gtest_filter='*Captured*' >"$OUT/sanitizer.log" 2>&1
    summary+="compute-sanitizer memcheck (captured decode steps, tiny model) rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log")"$'\n'
  fi
fi
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass build/CMakeFiles/fern_cuda.dir/src/cuda/linear.cu.o >"$OUT/linear.sass" 2>&1
  echo "SASS opcode mix of linear_kernel<4,32> (whole kernel):"
  awk '/Function : .*linear_kernelILi4ELi32E/{f=1;next} /Function :/{f=0} f' "$OUT/linear.sass" |
    grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+[A-Z0-9_.]+' | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -14
fi
if [ "$what" != tests ]; then
  timeout 240 ./build/bench/bench_cuda_decode ${BENCH_ARGS:-all} 2>&1 | tee "$OUT/bench.log"
fi
echo "== summary =="
printf "%s" "$summary"
