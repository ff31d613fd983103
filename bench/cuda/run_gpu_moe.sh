#!/usr/bin/env bash
# GPU call for the MoE prefill work (docs/notes/cuda-prefill-v2-moe.md), from the repository root.
#
# Full mode (`bash bench/cuda/run_gpu_moe.sh`), carry [".carry/debs", ".carry/moe-head.tar", ".carry/moe-head.commit"]:
# builds the committed tree (the git directory on the GPU machine is a snapshot from the session start, so the
# commit travels as an archive: `git archive -o .carry/moe-head.tar HEAD; git rev-parse --short=12 HEAD
# >.carry/moe-head.commit`): fern, every CUDA test and the two prefill micro-benchmarks; runs every CUDA test one
# after the other (run 1 ran them in parallel and their CPU references starved each other into time-outs), the
# MoE micro-benchmark, the linear one and `fern bench --phase prefill` on the full-size synthetic model.
#
# Prebuilt mode (`bash bench/cuda/run_gpu_moe.sh prebuilt`), carry [".carry/debs", ".carry/moe-bin.tar.xz"]: the
# binaries built here from the committed tree (x86-64, glibc 2.36) travel as an archive, so the call spends no time
# building: the MoE prefill test, `fern bench` (concurrently: the test is mostly CPU reference work), then the MoE
# micro-benchmark and the dense GEMM test alone.
# Logs under $OUT, a summary last.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
elapsed() { echo "$(( $(date +%s) - start )) s"; }
FERN_BENCH_ARGS="bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill --lengths 512,2048,4096 --runs 2"

if [ "${1:-}" = prebuilt ]; then
  source tools/gpu-env.sh
  mkdir -p /tmp/mb && tar -C /tmp/mb -xJf .carry/moe-bin.tar.xz || exit 1
  B=/tmp/mb
  note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(cat $B/commit) (prebuilt)"
  ( timeout 75 $B/cuda_test_cuda_moe_prefill --gtest_filter=-*RealShapeAgainstCpu >"$OUT/test_moe.log" 2>&1
    echo "rc $?" >>"$OUT/test_moe.log" ) &
  timeout 75 $B/fern $FERN_BENCH_ARGS >"$OUT/bench_prefill.log" 2>&1
  note "fern bench rc $? ($(elapsed))"
  wait
  note "moe prefill test: $(tail -1 "$OUT/test_moe.log"), $(grep -c '^\[       OK' "$OUT/test_moe.log") OK ($(elapsed))"
  grep -E "^moe prefill" "$OUT/test_moe.log" | sed -E 's/ +E=.*bits=([0-9]+) T=/ bits=\1 T=/'
  grep -B2 -A8 "Failure" "$OUT/test_moe.log" | head -40
  grep -E "^\|" "$OUT/bench_prefill.log" | tail -5
  timeout 20 $B/bench_cuda_moe_prefill >"$OUT/bench_moe.md" 2>&1
  cat "$OUT/bench_moe.md"
  timeout 20 $B/cuda_test_cuda_linear_gemm >"$OUT/test_gemm.log" 2>&1
  note "linear gemm test rc $?: $(grep -c '^\[       OK' "$OUT/test_gemm.log") OK ($(elapsed))"
  echo "== SUMMARY"; printf "%s" "$summary"
  exit 0
fi

rm -rf /tmp/w && mkdir -p /tmp/w && tar -C /tmp/w -xf .carry/moe-head.tar && cp -r .carry /tmp/w/ && cd /tmp/w || exit 1
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(cat .carry/moe-head.commit)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
targets="fern bench_cuda_moe_prefill bench_cuda_prefill_linear $(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_0-9]*' | sort -u | tr '\n' ' ')"
# -k 0: a target broken by someone else's commit must not stop the others from being built and run.
ninja -C build -k 0 -j16 $targets >"$OUT/build.log" 2>&1 || grep -E "error|FAILED" "$OUT/build.log" | head -30
note "build: $(elapsed)"
fails=""
for t in build/cuda_test_*; do
  [ -x "$t" ] || continue
  timeout 150 "$t" >>"$OUT/tests.log" 2>&1 || fails+=" $(basename "$t")"
done
note "CUDA tests: $(grep -c '^\[       OK' "$OUT/tests.log") OK, failed:${fails:- none} ($(elapsed))"
grep -E "^moe prefill" "$OUT/tests.log"
grep -B3 -A12 "Failure" "$OUT/tests.log" | head -60
timeout 60 build/bench/bench_cuda_moe_prefill 2>&1 | tee "$OUT/bench_moe.md"
timeout 40 build/bench/bench_cuda_prefill_linear 2>&1 | grep -E "^\| (gdn|out_proj|expert)" >"$OUT/bench_linear.md"
cat "$OUT/bench_linear.md"
timeout 120 ./build/fern $FERN_BENCH_ARGS >"$OUT/bench_prefill.log" 2>&1
grep -E "^\|" "$OUT/bench_prefill.log" | tail -6
note "total $(elapsed)"
echo "== SUMMARY"; printf "%s" "$summary"
