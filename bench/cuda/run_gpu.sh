#!/usr/bin/env bash
# One GPU-machine call for the decode work (docs/notes/cuda-decode-v4.md). The git directory on the GPU machine is a
# snapshot from the session start, so the commit to test travels as an archive:
#   git archive -o .carry/decode-head.tar HEAD && git rev-parse --short=12 HEAD >.carry/decode-head.commit
# then, with carry [".carry/debs", ".carry/decode-head.tar", ".carry/decode-head.commit"]:
#   bash bench/cuda/run_gpu.sh full    build fern, every CUDA test and the decode benchmark; every CUDA test with
#                                      PDL on, the decode-path tests also with it off; compute-sanitizer memcheck of
#                                      captured decode steps; `bench_cuda_decode all`; `fern bench --phase decode` at
#                                      4K and 128K; a short summary last.
#   bash bench/cuda/run_gpu.sh quick   the MoE, attention and whole-model tests and `bench_cuda_decode decode`.
set -u
MODE=${1:-full}
source bench/gpu_prelude.sh
mkdir -p "$OUT/logs"
L="$OUT/logs"
gpu_unpack_head decode-head
gpu_configure
note "mode $MODE"
mine="cuda_test_cuda_linear cuda_test_cuda_linear_multi cuda_test_cuda_misc cuda_test_cuda_gdn cuda_test_cuda_attn cuda_test_cuda_moe cuda_test_cuda_forward"
if [ "$MODE" = quick ]; then
  tests="cuda_test_cuda_moe cuda_test_cuda_attn cuda_test_cuda_forward"
  others=""
  targets="$tests bench_cuda_decode"
else
  tests=$mine
  others=$(gpu_cuda_test_targets | tr ' ' '\n' | grep -vxF -f <(tr ' ' '\n' <<<"$mine") | tr '\n' ' ')
  targets="$tests $others bench_cuda_decode fern"
fi
gpu_build $targets
fails=""
for t in $tests; do
  FERN_CUDA_PDL=1 timeout 100 ./build/$t >"$L/$t.pdl1.log" 2>&1 || fails+=" $t"
done
if [ "$MODE" = full ]; then
  for t in cuda_test_cuda_moe cuda_test_cuda_forward; do
    FERN_CUDA_PDL=0 timeout 100 ./build/$t >"$L/$t.pdl0.log" 2>&1 || fails+=" $t(PDL off)"
  done
fi
note "decode CUDA tests: $(cat $L/*.pdl1.log | grep -c '^\[       OK') OK with PDL, $(cat $L/*.pdl0.log 2>/dev/null | grep -c '^\[       OK') OK without; failed:${fails:- none} ($(elapsed))"
grep -hE "^moe |^linear_multi norm|NMSE|top-1|graph replay" "$L"/cuda_test_cuda_moe.pdl1.log "$L"/cuda_test_cuda_attn.pdl1.log \
  "$L"/cuda_test_cuda_linear_multi.pdl1.log "$L"/cuda_test_cuda_gdn.pdl1.log "$L"/cuda_test_cuda_forward.pdl1.log 2>/dev/null |
  grep -vE "^linear_multi (gdn|attn|one|odd|group|8-bit|bf16|single|mixed)" | cut -c1-150 | head -70
grep -hB3 -A10 "Failure\|FAILED  \]" "$L"/*.log | head -60
if [ "$MODE" = full ] && command -v compute-sanitizer >/dev/null; then
  FERN_CUDA_PDL=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/cuda_test_cuda_forward \
    --gtest_filter='*Captured*' >"$L/sanitizer.log" 2>&1
  note "memcheck (captured decode steps, PDL on) rc=$?: $(grep -E 'ERROR SUMMARY' "$L/sanitizer.log")"
fi
# If the fused MoE failed its own tests, measure everything else with the three-launch MoE.
case "$fails" in *cuda_test_cuda_moe*) export FERN_CUDA_MOE_FUSED=0; note "fused MoE off for the benchmarks";; esac
what=$([ "$MODE" = quick ] && echo decode || echo all)
FERN_CUDA_PDL=1 timeout 100 ./build/bench/bench_cuda_decode $what 2>&1 | tee "$OUT/bench_decode.log"
note "bench_cuda_decode $what rc=${PIPESTATUS[0]} ($(elapsed))"
if [ "$MODE" = full ]; then
  timeout 100 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 --runs 3 \
    >"$OUT/fern_bench.log" 2>&1
  note "fern bench rc=$? ($(elapsed))"
  tail -8 "$OUT/fern_bench.log"
  # The other helpers' CUDA tests (prefill paths) last, within what is left of the call.
  ofails=""
  for t in $others; do
    left=$(( gpu_start + 185 - $(date +%s) ))
    [ $left -lt 10 ] && { ofails+=" $t(not run: time)"; continue; }
    timeout $left ./build/$t >"$L/$t.other.log" 2>&1 || ofails+=" $t"
  done
  note "other CUDA tests: $(cat $L/*.other.log 2>/dev/null | grep -c '^\[       OK') OK; failed or not run:${ofails:- none}"
  grep -hB2 -A6 "Failure" "$L"/*.other.log 2>/dev/null | head -30
fi
note "total $(elapsed)"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
gpu_summary
