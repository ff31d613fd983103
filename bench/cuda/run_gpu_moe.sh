#!/usr/bin/env bash
# One GPU call for the MoE prefill work (docs/notes/cuda-prefill-v2-moe.md), from the repository root with carry
# [".carry/debs", ".carry/moe-head.tar", ".carry/moe-head.commit"]: build, from the committed tree (the git directory
# on the GPU machine is a snapshot from the session start, so the commit travels as an archive:
# `git archive -o .carry/moe-head.tar HEAD; git rev-parse --short=12 HEAD >.carry/moe-head.commit`) fern, every
# CUDA test and the two prefill micro-benchmarks; run every CUDA test (in parallel: they check results, not time);
# the MoE micro-benchmark; the linear one (the shared tile loop); `fern bench --phase prefill` on the full-size
# synthetic model. Logs under $OUT, a summary last.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
rm -rf /tmp/w && mkdir -p /tmp/w && tar -C /tmp/w -xf .carry/moe-head.tar && cp -r .carry /tmp/w/ && cd /tmp/w || exit 1
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(cat .carry/moe-head.commit)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
targets="fern bench_cuda_moe_prefill bench_cuda_prefill_linear $(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_0-9]*' | sort -u | tr '\n' ' ')"
# -k 0: a target broken by someone else's commit must not stop the others from being built and run.
ninja -C build -k 0 -j16 $targets >"$OUT/build.log" 2>&1 || grep -E "error|FAILED" "$OUT/build.log" | head -30
note "build: $(( $(date +%s) - start )) s"
mkdir -p /tmp/tl
for t in build/cuda_test_*; do
  [ -x "$t" ] || continue
  ( timeout 150 "$t" >"/tmp/tl/$(basename "$t").log" 2>&1 || echo " $(basename "$t")" >>/tmp/tl/FAILED ) &
done
wait
cat /tmp/tl/*.log >"$OUT/tests.log"
fails=$(cat /tmp/tl/FAILED 2>/dev/null | tr -d '\n')
note "CUDA tests: $(grep -c '^\[       OK' "$OUT/tests.log") OK, failed:${fails:- none} ($(( $(date +%s) - start )) s)"
grep -E "^moe prefill" "$OUT/tests.log"
grep -B3 -A12 "FAILED\|Failure" "$OUT/tests.log" | head -60
timeout 60 build/bench/bench_cuda_moe_prefill 2>&1 | tee "$OUT/bench_moe.md"
note "moe bench done ($(( $(date +%s) - start )) s)"
timeout 40 build/bench/bench_cuda_prefill_linear 2>&1 | grep -E "^\| (gdn|out_proj|expert)" >"$OUT/bench_linear.md"
cat "$OUT/bench_linear.md"
timeout 120 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill --lengths 512,2048,4096 --runs 2 \
  >"$OUT/bench_prefill.log" 2>&1
grep -E "^\|" "$OUT/bench_prefill.log" | tail -6
note "total $(( $(date +%s) - start )) s"
echo "== SUMMARY"; printf "%s" "$summary"
