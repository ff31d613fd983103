#!/usr/bin/env bash
# One GPU-machine call for the decode work (docs/notes/cuda-decode-v4.md): build fern, every CUDA test and the
# decode benchmark; run every CUDA test with programmatic dependent launch on, the decode-path tests (MoE, whole
# model) also with it off; compute-sanitizer memcheck of captured decode steps; a kernel-level profile of the 4K
# step (when nsys exists); `bench_cuda_decode all`; `fern bench --phase decode` at 4K and 128K; a short summary last.
# Usage (repository root of a clean clone of HEAD, carry [".carry/debs"]): bash bench/cuda/run_gpu.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
L="$OUT/logs"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
source tools/gpu-env.sh
# The carried packages lack brotli's pkg-config files, which cpp-httplib's .pc requires; empty stand-ins are
# enough for the configure step.
stub=/tmp/fern-pc-stubs
mkdir -p $stub
for m in libbrotlicommon libbrotlidec libbrotlienc; do
  printf 'Name: %s\nDescription: stand-in for configuring\nVersion: 1.0.9\nLibs:\nCflags:\n' $m >$stub/$m.pc
done
export PKG_CONFIG_PATH="$PKG_CONFIG_PATH:$stub"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(git rev-parse --short=12 HEAD)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA=ON -DFERN_CUDA_ARCHS=90a-real >"$L/cmake.log" 2>&1 ||
  { tail -20 "$L/cmake.log"; exit 1; }
tests=$(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_0-9]*' | sort -u | tr '\n' ' ')
ninja -C build -j16 $tests bench_cuda_decode fern >"$L/build.log" 2>&1 || { grep -E "error|FAILED" "$L/build.log" | head -30; exit 1; }
note "build: $(( $(date +%s) - start )) s"
fails=""
for t in $tests; do
  FERN_CUDA_PDL=1 timeout 100 ./build/$t >"$L/$t.pdl1.log" 2>&1 || fails+=" $t"
done
for t in cuda_test_cuda_moe cuda_test_cuda_forward; do
  FERN_CUDA_PDL=0 timeout 100 ./build/$t >"$L/$t.pdl0.log" 2>&1 || fails+=" $t(PDL off)"
done
note "CUDA tests: $(cat $L/*.pdl1.log | grep -c '^\[       OK') OK with PDL, $(cat $L/*.pdl0.log | grep -c '^\[       OK') OK without; failed:${fails:- none} ($(( $(date +%s) - start )) s)"
grep -hE "^moe |NMSE|top-1|graph replay" "$L"/cuda_test_cuda_moe.pdl1.log "$L"/cuda_test_cuda_forward.pdl1.log | head -40
grep -hB3 -A10 "Failure\|FAILED  \]" "$L"/*.log | head -60
if command -v compute-sanitizer >/dev/null; then
  FERN_CUDA_PDL=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/cuda_test_cuda_forward \
    --gtest_filter='*Captured*' >"$L/sanitizer.log" 2>&1
  note "memcheck (captured decode steps, PDL on) rc=$?: $(grep -E 'ERROR SUMMARY' "$L/sanitizer.log")"
fi
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  timeout 90 "$NSYS" profile -o "$L/step" --force-overwrite true --cuda-graph-trace=node -t cuda \
    ./build/bench/bench_cuda_decode profile 20 >"$L/nsys.log" 2>&1
  timeout 60 "$NSYS" stats -r cuda_gpu_kern_sum -f csv -o "$L/kern" "$L/step.nsys-rep" >>"$L/nsys.log" 2>&1
  echo "kernels of 21 4K decode steps (nsys, total ns, instances, avg ns, name):"
  f=$(ls "$L"/kern*.csv 2>/dev/null | head -1)
  [ -n "$f" ] && cut -d, -f2,3,4,9 "$f" | head -25 | cut -c1-160
else
  note "nsys: not found"
fi
FERN_CUDA_PDL=1 timeout 150 ./build/bench/bench_cuda_decode all 2>&1 | tee "$OUT/bench_decode.log"
timeout 120 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 --runs 3 \
  >"$OUT/fern_bench.log" 2>&1
note "fern bench rc=$?:"
tail -8 "$OUT/fern_bench.log"
note "total $(( $(date +%s) - start )) s"
rm -f "$L"/*.sqlite "$L"/*.nsys-rep
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
echo "== SUMMARY"; printf "%s" "$summary"
