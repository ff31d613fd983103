#!/usr/bin/env bash
# One GPU-machine session for the CUDA backend: build the CUDA tests and the benchmark, run the tests with
# programmatic dependent launch and parallel branches off, then both on, memcheck a captured decode loop, dump the
# GEMV kernel's SASS instruction mix, run the benchmark (PDL on: everything; PDL off, and branches off: the decode
# part), print a short summary.
# Usage (from the repository root, with carry [".carry"]): bash bench/cuda/run_gpu.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
L="$OUT/logs"
source tools/gpu-env.sh
# The carried packages lack brotli's pkg-config files, which cpp-httplib's .pc requires; the CUDA targets do not
# link the HTTP server, so empty stand-ins are enough for the configure step.
stub=/tmp/fern-pc-stubs
mkdir -p $stub
for m in libbrotlicommon libbrotlidec libbrotlienc; do
  printf 'Name: %s\nDescription: stand-in for configuring\nVersion: 1.0.9\nLibs:\nCflags:\n' $m >$stub/$m.pc
done
export PKG_CONFIG_PATH="$PKG_CONFIG_PATH:$stub"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$L/gpu.txt"
tests="cuda_test_cuda_linear cuda_test_cuda_linear_multi cuda_test_cuda_misc cuda_test_cuda_gdn cuda_test_cuda_attn cuda_test_cuda_moe cuda_test_cuda_forward"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA=ON -DFERN_CUDA_ARCHS=90a-real >"$L/cmake.log" 2>&1 ||
  { tail -20 "$L/cmake.log"; exit 1; }
ninja -C build -j16 $tests bench_cuda_decode >"$L/build.log" 2>&1 || { grep -E "error:|FAILED" "$L/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
summary=""
for pdl in 0 1; do
  for t in $tests; do
    FERN_CUDA_BRANCHES=$pdl FERN_CUDA_PDL=$pdl timeout 60 ./build/$t >"$L/$t.pdl$pdl.log" 2>&1
    rc=$?
    line="PDL=branches=$pdl $t rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/$t.pdl$pdl.log" | tr '\n' ' ')"
    echo "$line"  # also as it happens, in case a later step runs past the time limit
    summary+="$line"$'\n'
    grep -E "Failure|Expected|Which is|actual" "$L/$t.pdl$pdl.log" | head -12
    [ $pdl = 1 ] && grep -E "linear_multi|NMSE.*(moe|MoE|fused)|top-1|graph replay" "$L/$t.pdl$pdl.log" | head -24
  done
done
if command -v compute-sanitizer >/dev/null; then
  FERN_CUDA_PDL=1 timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/cuda_test_cuda_forward \
    --gtest_filter='*Captured*' >"$L/sanitizer.log" 2>&1
  summary+="compute-sanitizer memcheck (captured decode steps, tiny model, PDL on) rc=$?: $(grep -E 'ERROR SUMMARY' "$L/sanitizer.log")"$'\n'
fi
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass build/CMakeFiles/fern_cuda.dir/src/cuda/linear.cu.o >"$L/linear.sass" 2>&1
  # The kernel body holds two unrolled pipeline steps of 2 chunks x 2 rows: 8 chunk-rows.
  awk '/Function : .*linear_kernelILi4ELi32ELb0ELb0E/{f=1;next} /Function :/{f=0} f' "$L/linear.sass" |
    grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+[A-Z0-9_.]+' | awk '{print $2}' | sed 's/\..*//' >"$L/l432.ops"
  echo "SASS of linear_kernel<4,32>: $(wc -l <"$L/l432.ops") instructions (8 chunk-rows per unrolled body); top opcodes:"
  sort "$L/l432.ops" | uniq -c | sort -rn | head -12 | tr '\n' ' '; echo
fi
FERN_CUDA_PDL=1 timeout 110 ./build/bench/bench_cuda_decode all 2>&1 | tee "$OUT/bench_pdl1.log"
# (Version 3: the PDL-off and branches-off decode benchmarks are left out to fit one 240 s call; the forward pass
# now runs the projections of one input as one linear_multi launch, so branches no longer apply to it.)
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
echo "== summary =="
printf "%s" "$summary"
