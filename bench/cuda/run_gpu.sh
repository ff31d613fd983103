#!/usr/bin/env bash
# One GPU-machine call for the decode work (docs/notes/cuda-decode-v5.md). The git directory on the GPU machine is a
# snapshot from the session start, so the commit to test travels as an archive:
#   git archive -o .carry/decode-head.tar HEAD && git rev-parse --short=12 HEAD >.carry/decode-head.commit
# then, with carry [".carry/debs", ".carry/decode-head.tar", ".carry/decode-head.commit"]:
#   bash bench/cuda/run_gpu.sh full    build fern, the decode-path tests and the decode benchmark, with the fused
#                                      MoE's phase timing compiled in (-DFERN_MOE_PHASE_TIMING: a separate kernel
#                                      instantiation that only the benchmark launches); the decode tests with PDL
#                                      on, the MoE and whole-model tests also with it off; `bench_cuda_decode steps`
#                                      (cold-L2 GEMV table, per-block breakdown, MoE phases, decode steps); `fern
#                                      bench --phase decode` at 4K and 128K; compute-sanitizer memcheck of captured
#                                      decode steps last; a short summary at the end.
#   bash bench/cuda/run_gpu.sh quick   the MoE, attention and whole-model tests and `bench_cuda_decode decode`.
# Every step after the build gets what is left of LIMIT seconds (default 250), so that the call ends in time.
set -u
MODE=${1:-full}
LIMIT=${LIMIT:-250}
source bench/gpu_prelude.sh
mkdir -p "$OUT/logs"
L="$OUT/logs"
left() {  # seconds left in this call, at most $1 (default 100), at least 1
  local l=$(( gpu_start + LIMIT - $(date +%s) ))
  [ $l -gt ${1:-100} ] && l=${1:-100}
  [ $l -lt 1 ] && l=1
  echo $l
}
export CUDAFLAGS="${CUDAFLAGS:-} -DFERN_MOE_PHASE_TIMING"  # read by the first configure (CMAKE_CUDA_FLAGS)
gpu_unpack_head decode-head
gpu_configure
note "mode $MODE, limit $LIMIT s"
mine="cuda_test_cuda_linear cuda_test_cuda_linear_multi cuda_test_cuda_misc cuda_test_cuda_gdn cuda_test_cuda_attn cuda_test_cuda_moe cuda_test_cuda_forward"
if [ "$MODE" = quick ]; then
  tests="cuda_test_cuda_moe cuda_test_cuda_attn cuda_test_cuda_forward"
  targets="$tests bench_cuda_decode"
else
  tests=$mine
  targets="$tests bench_cuda_decode fern"
fi
gpu_build $targets
fails=""
for t in $tests; do
  FERN_CUDA_PDL=1 timeout $(left 100) ./build/$t >"$L/$t.pdl1.log" 2>&1 || fails+=" $t"
done
note "decode CUDA tests: $(cat $L/*.pdl1.log | grep -c '^\[       OK') OK with PDL; failed:${fails:- none} ($(elapsed))"
grep -hE "^moe |^linear_multi norm|NMSE|top-1|graph replay" "$L"/cuda_test_cuda_moe.pdl1.log "$L"/cuda_test_cuda_attn.pdl1.log \
  "$L"/cuda_test_cuda_linear.pdl1.log "$L"/cuda_test_cuda_linear_multi.pdl1.log "$L"/cuda_test_cuda_gdn.pdl1.log \
  "$L"/cuda_test_cuda_forward.pdl1.log 2>/dev/null |
  grep -vE "^linear_multi (gdn|attn|one|odd|group|8-bit|bf16|single|mixed)" | cut -c1-150 | head -70
grep -hB3 -A10 "Failure\|FAILED  \]" "$L"/*.log | head -60
# If the fused MoE failed its own tests, measure everything else with the three-launch MoE.
case "$fails" in *cuda_test_cuda_moe*) export FERN_CUDA_MOE_FUSED=0; note "fused MoE off for the benchmarks";; esac
what=$([ "$MODE" = quick ] && echo decode || echo steps)
FERN_CUDA_PDL=1 timeout $(left 100) ./build/bench/bench_cuda_decode $what 2>&1 | tee "$OUT/bench_decode.log"
note "bench_cuda_decode $what rc=${PIPESTATUS[0]} ($(elapsed))"
if [ "$MODE" = full ]; then
  timeout $(left 100) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 \
    --runs 3 >"$OUT/fern_bench.log" 2>&1
  note "fern bench rc=$? ($(elapsed))"
  tail -8 "$OUT/fern_bench.log"
  pfails=""
  for t in cuda_test_cuda_moe cuda_test_cuda_forward; do
    [ $(left) -lt 15 ] && { pfails+=" $t(not run: time)"; continue; }
    FERN_CUDA_PDL=0 timeout $(left 100) ./build/$t >"$L/$t.pdl0.log" 2>&1 || pfails+=" $t"
  done
  note "PDL off: $(cat $L/*.pdl0.log 2>/dev/null | grep -c '^\[       OK') OK; failed or not run:${pfails:- none} ($(elapsed))"
  if command -v compute-sanitizer >/dev/null && [ $(left) -ge 15 ]; then
    FERN_CUDA_PDL=1 timeout $(left 60) compute-sanitizer --tool memcheck --error-exitcode 9 ./build/cuda_test_cuda_forward \
      --gtest_filter='*Captured*' >"$L/sanitizer.log" 2>&1
    note "memcheck (captured decode steps, PDL on) rc=$?: $(grep -E 'ERROR SUMMARY' "$L/sanitizer.log")"
  else
    note "memcheck: not run (time or no compute-sanitizer)"
  fi
fi
note "total $(elapsed)"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
gpu_summary
