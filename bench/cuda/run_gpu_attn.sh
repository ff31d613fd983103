#!/usr/bin/env bash
# One GPU call for the attention prefill work (docs/notes/cuda-prefill-v2-attn.md), from the repository root with
# carry [".carry/debs", ".carry/attn-head.tar", ".carry/attn-head.commit"]: build fern, every CUDA test and the attention micro-benchmark from an archive of HEAD;
# run the new test first, then every other CUDA test, the micro-benchmark and `fern bench --phase prefill` on the
# full-size synthetic model. Logs under $OUT, a summary last.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
# The git directory there is a snapshot from the start of the session (docs/GPU.md): the commit to test travels as
# .carry/attn-head.tar (`git archive -o .carry/attn-head.tar HEAD; git rev-parse --short=12 HEAD >.carry/attn-head.commit`).
rm -rf /tmp/w && mkdir -p /tmp/w && tar -C /tmp/w -xf .carry/attn-head.tar && cp -r .carry /tmp/w/ && cd /tmp/w || exit 1
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(cat .carry/attn-head.commit)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
targets="fern bench_cuda_attn_prefill $(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_]*' | sort -u | tr '\n' ' ')"
# -k 0: a target broken by someone else's commit must not stop the others from being built and run.
ninja -C build -k 0 -j16 $targets >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; note "BUILD FAILED (some targets)"; }
[ -x build/cuda_test_cuda_attn_prefill ] || { echo "== SUMMARY"; printf "%s" "$summary"; exit 1; }
note "build: $(( $(date +%s) - start )) s"
fails=""
timeout 120 build/cuda_test_cuda_attn_prefill >"$OUT/test_attn_prefill.log" 2>&1 || fails+=" cuda_test_cuda_attn_prefill"
grep -E "^(attn prefill|peaked)|Failure|Expected|Which is" "$OUT/test_attn_prefill.log" | head -70
note "attn prefill test: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_attn_prefill.log" | tr '\n' ' ') ($(( $(date +%s) - start )) s)"
for t in build/cuda_test_*; do
  [ -x "$t" ] || continue
  [ "$(basename "$t")" = cuda_test_cuda_attn_prefill ] && continue
  timeout 60 "$t" >>"$OUT/tests.log" 2>&1 || fails+=" $(basename "$t")"
done
note "CUDA tests: $(grep -c '^\[       OK' "$OUT/tests.log") OK besides attn_prefill, failed:${fails:- none} ($(( $(date +%s) - start )) s)"
grep -B3 -A8 "FAILED\|Failure" "$OUT/tests.log" | head -40
timeout 60 build/bench/bench_cuda_attn_prefill 2>&1 | tee "$OUT/bench_attn.md"
note "micro-benchmark done ($(( $(date +%s) - start )) s)"
timeout 100 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill --lengths 512,4096 --runs 2 \
  >"$OUT/bench_prefill.log" 2>&1
tail -8 "$OUT/bench_prefill.log"
note "prefill: $(grep -oE "prefill [0-9]+: [0-9.]+ tok/s" "$OUT/bench_prefill.log" | tr "\n" " ")"
note "total $(( $(date +%s) - start )) s"
echo "== SUMMARY"; printf "%s" "$summary"
