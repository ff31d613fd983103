#!/usr/bin/env bash
# One GPU call for the Gated DeltaNet prefill work (docs/notes/cuda-prefill-v2-gdn.md), from the repository root
# with carry [".carry/debs", ".carry/gdn-head.tar", ".carry/gdn-head.commit"]: the committed tree travels as an
# archive (the git directory on the GPU machine is a snapshot from the session start):
# `git archive -o .carry/gdn-head.tar HEAD; git rev-parse --short=12 HEAD >.carry/gdn-head.commit`.
# Build fern, every CUDA test and the GDN prefill micro-benchmark; run every CUDA test (concurrently: they check
# results, not time); the micro-benchmark; `fern bench --phase prefill` on the full-size synthetic model; a memcheck
# of the new tests. Logs under $OUT, a summary last.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
rm -rf /tmp/w && mkdir -p /tmp/w && tar -C /tmp/w -xf .carry/gdn-head.tar && cp -r .carry /tmp/w/ && cd /tmp/w || exit 1
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(cat .carry/gdn-head.commit)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
targets="fern bench_cuda_gdn_prefill $(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_0-9]*' | sort -u | tr '\n' ' ')"
# -k 0: a target broken by someone else's commit must not stop the others from being built and run.
ninja -C build -k 0 -j16 $targets >"$OUT/build.log" 2>&1 || grep -E "error|FAILED" "$OUT/build.log" | head -30
note "build: $(( $(date +%s) - start )) s"
pids=""
for t in build/cuda_test_*; do
  [ -x "$t" ] || continue
  ( OMP_NUM_THREADS=4 timeout 100 "$t" >"$OUT/$(basename "$t").log" 2>&1; echo $? >"$OUT/$(basename "$t").rc" ) &
  pids+=" $!"
done
wait $pids
fails=""
ok=0
for r in "$OUT"/cuda_test_*.rc; do
  n=$(basename "$r" .rc)
  [ "$(cat "$r")" = 0 ] || fails+=" $n(rc $(cat "$r"))"
  ok=$(( ok + $(grep -c '^\[       OK' "$OUT/$n.log") ))
done
note "CUDA tests: $ok OK, failed:${fails:- none} ($(( $(date +%s) - start )) s)"
grep -h "^gdn" "$OUT"/cuda_test_cuda_gdn*.log
grep -h -B3 -A8 "FAILED\|Failure" "$OUT"/cuda_test_*.log | head -50
timeout 60 build/bench/bench_cuda_gdn_prefill 2>&1 | tee "$OUT/bench_gdn.md"
note "micro-benchmark done ($(( $(date +%s) - start )) s)"
timeout 90 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill --lengths 512,4096 --runs 2 \
  >"$OUT/bench_prefill.log" 2>&1
tail -8 "$OUT/bench_prefill.log"
note "fern bench: $(grep -E '^\|? *(512|4096|4,096) ' "$OUT/bench_prefill.log" | tr -s ' ' | tr '\n' ';') ($(( $(date +%s) - start )) s)"
if command -v compute-sanitizer >/dev/null; then
  timeout 30 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/cuda_test_cuda_gdn_prefill \
    --gtest_filter=*Awkward* >"$OUT/memcheck.log" 2>&1
  note "memcheck (gdn prefill tests) rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log")"
fi
note "total $(( $(date +%s) - start )) s"
echo "== SUMMARY"; printf "%s" "$summary"
