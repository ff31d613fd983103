#!/usr/bin/env bash
# One GPU-machine call for the decode work (docs/notes/cuda-decode-v7.md). The git directory on the GPU machine is a
# snapshot from the session start, so the commit to test travels as an archive:
#   git archive -o .carry/decode-head.tar HEAD && git rev-parse --short=12 HEAD >.carry/decode-head.commit
# then, with carry [".carry/debs", ".carry/decode-head.tar", ".carry/decode-head.commit"]:
#   bash bench/cuda/run_gpu.sh full    build fern, the decode-path tests and the decode benchmark, with the fused
#                                      MoE's phase timing compiled in (-DFERN_MOE_PHASE_TIMING: a separate kernel
#                                      instantiation that only the benchmark launches); the decode tests with PDL
#                                      on; the whole-model decode checks twice more with PDL on, once with the
#                                      256-thread MoE blocks, and (with the MoE tests) with PDL off (the test
#                                      model's GEMVs are too narrow for 512-thread blocks; the GEMV tests force
#                                      both sizes); where a whole-model check fails with PDL on, the switch
#                                      matrix of `diag` as well;
#                                      `bench_cuda_decode steps` (cold-L2 GEMV table, per-block breakdown, MoE
#                                      phases, decode steps); `fern bench --phase decode` at 4K and 128K;
#                                      compute-sanitizer memcheck of captured decode steps last; a short summary.
#   bash bench/cuda/run_gpu.sh quick   the MoE, attention and whole-model tests and `bench_cuda_decode decode`.
#   bash bench/cuda/run_gpu.sh final   the shortest check of a tree to leave: the whole-model decode checks with PDL
#                                      on, the MoE tests, `bench_cuda_decode blocks` (the 4K breakdown and the MoE
#                                      phases), `fern bench --phase decode` at 4K and 128K, the whole-model checks
#                                      with PDL off last.
#   bash bench/cuda/run_gpu.sh diag    the whole-model decode checks under each switch back to an earlier form.
# Optional: carry .carry/decode-sass-src.tar (`git archive -o .carry/decode-sass-src.tar COMMIT src`) to get the SASS
# of that commit's linear.cu and moe_fused.cu next to this build's (sass/*.sass.gz, and per kernel the loads that
# ptxas placed before the PDL wait, sass/prewait.txt).
# Every step after the build gets what is left of LIMIT seconds (default 250), so that the call ends in time.
# FERN_BENCH=0 skips `fern bench` (its model generation alone takes ~45 s; bench_cuda_decode's decode steps give the
# same step time), MEMCHECK=0 the memcheck, FWD_AGAIN=N the number of extra whole-model runs (default 2).
set -u
MODE=${1:-full}
LIMIT=${LIMIT:-250}
source bench/gpu_prelude.sh
mkdir -p "$OUT/logs" "$OUT/sass"
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
export PATH=$PATH:/usr/local/cuda/bin  # nvcc, cuobjdump, compute-sanitizer
note "mode $MODE, limit $LIMIT s"

# SASS of another commit's GEMV and fused MoE (compiled in the background while the build runs).
nvflags="-DFERN_HAVE_CUDA=1 -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] --expt-relaxed-constexpr -std=c++20 -x cu"
sass_pid=""
if [ -f .carry/decode-sass-src.tar ]; then
  ( rm -rf /tmp/sass_src && mkdir -p /tmp/sass_src && tar -C /tmp/sass_src -xf .carry/decode-sass-src.tar &&
    for f in linear moe_fused; do
      nvcc $nvflags -I/tmp/sass_src/src -cubin /tmp/sass_src/src/cuda/$f.cu -o /tmp/sass_src/$f.cubin &&
        cuobjdump -sass /tmp/sass_src/$f.cubin >"$OUT/sass/other.$f.sass"
    done ) >"$L/sass_other.log" 2>&1 &
  sass_pid=$!
fi
# Per kernel: the global loads before the first griddepcontrol.wait (ACQBULK in SASS), by kind.
prewait() {
  awk 'function flush() { if (fn != "") { printf "%s pre-wait LDG %d%s:", fn, pre, (seen ? "" : " (no ACQBULK)");
                                           for (k in kinds) printf " %s x%d", k, kinds[k]; printf "\n" }
                          delete kinds }
       /Function :/ { flush(); fn = $3; pre = 0; seen = 0; next }
       /ACQBULK/ { seen = 1 }
       /LDG/ && !seen { match($0, /LDG[.A-Z0-9_]*/); pre++; kinds[substr($0, RSTART, RLENGTH)]++ }
       END { flush() }' "$1"
}

run_fwd() {  # the whole-model decode checks with PDL on unless the row's variables say otherwise
  local name=$1
  shift
  env FERN_CUDA_PDL=1 "$@" timeout $(left 30) ./build/cuda_test_cuda_forward --gtest_filter='*RandomModel*:*Captured*' \
    >"$L/fwd.$name.log" 2>&1
  local rc=$?
  note "forward [$name] rc=$rc: $(grep -hE '^random 8-layer|^graph replay' "$L/fwd.$name.log" |
    sed 's/random 8-layer model: //; s/prefill 192 //' | tr '\n' ' ')"
  return $rc
}
diag_rows() {
  run_fwd moe-three-launch FERN_CUDA_MOE_FUSED=0
  run_fwd moe-256 FERN_CUDA_MOE_WIDE=0
  run_fwd pdl-off FERN_CUDA_PDL=0
}

if [ "$MODE" = diag ]; then
  gpu_build cuda_test_cuda_forward cuda_test_cuda_moe cuda_test_cuda_linear cuda_test_cuda_linear_multi
  run_fwd default
  run_fwd default-again
  diag_rows
  for t in moe linear linear_multi; do
    FERN_CUDA_PDL=1 timeout $(left 40) ./build/cuda_test_cuda_$t >"$L/$t.log" 2>&1
    note "cuda_test_cuda_$t rc=$?: $(grep -c '^\[       OK' "$L/$t.log") OK"
  done
  grep -hB2 -A8 "Failure" "$L"/*.log | head -40
  note "total $(elapsed)"
  tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
  gpu_summary
  exit 0
fi
# The tests of what this work changes (GEMV, multi-matrix GEMV, MoE) and the whole-model checks; TESTS=all adds
# the other decode kernels' tests (misc, GDN, attention).
mine="cuda_test_cuda_linear cuda_test_cuda_linear_multi cuda_test_cuda_moe cuda_test_cuda_forward"
if [ "$MODE" = final ]; then
  gpu_build cuda_test_cuda_forward cuda_test_cuda_moe bench_cuda_decode fern
  run_fwd default
  FERN_CUDA_PDL=1 timeout $(left 40) ./build/cuda_test_cuda_moe >"$L/moe.pdl1.log" 2>&1
  note "cuda_test_cuda_moe (PDL on) rc=$?: $(grep -c '^\[       OK' "$L/moe.pdl1.log") OK ($(elapsed))"
  grep -hB3 -A10 "Failure\|FAILED  \]" "$L"/*.log | head -30
  FERN_CUDA_PDL=1 timeout $(left 60) ./build/bench/bench_cuda_decode blocks >"$OUT/bench_decode.log" 2>&1
  note "bench_cuda_decode blocks rc=$? ($(elapsed))"
  grep -E "^[ 0-9(a-z]" "$OUT/bench_decode.log" | grep -vE "^programmatic" | head -60
  timeout $(left 80) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 \
    --runs 3 >"$OUT/fern_bench.log" 2>&1
  note "fern bench rc=$? ($(elapsed)): $(grep -E 'decode ctx' "$OUT/fern_bench.log" | sed 's/.*decode/decode/' | tr '\n' ' ')"
  run_fwd pdl-off FERN_CUDA_PDL=0
  note "total $(elapsed)"
  tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
  gpu_summary
  exit 0
fi
[ "${TESTS:-}" = all ] && mine="$mine cuda_test_cuda_misc cuda_test_cuda_gdn cuda_test_cuda_attn"
if [ "$MODE" = quick ]; then
  tests="cuda_test_cuda_moe cuda_test_cuda_attn cuda_test_cuda_forward"
  targets="$tests bench_cuda_decode"
else
  tests=$mine
  targets="$tests bench_cuda_decode $([ "${FERN_BENCH:-1}" = 1 ] && echo fern)"
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
  grep -vE "^linear_multi (gdn|attn|one|odd|group|8-bit|bf16|single|mixed)|call [123] " | cut -c1-150 | head -70
grep -hB3 -A10 "Failure\|FAILED  \]" "$L"/*.log | head -60
# The whole-model decode checks again (the version 5 failure was intermittent in its tokens), with the 256-thread
# MoE blocks, and with PDL off; the switch matrix where any PDL-on row fails.
fwd_fail=0
for i in $(seq 1 ${FWD_AGAIN:-2}); do run_fwd again-$i || fwd_fail=1; done
run_fwd moe-256-threads FERN_CUDA_MOE_WIDE=0 || fwd_fail=1
case "$fails" in *cuda_test_cuda_forward*) fwd_fail=1;; esac
[ $fwd_fail = 1 ] && diag_rows
if [ -n "$sass_pid" ]; then
  wait $sass_pid
  note "other commit's SASS: $(ls "$OUT/sass" | tr '\n' ' ')"
fi
if command -v cuobjdump >/dev/null; then
  for f in linear moe_fused; do
    cuobjdump -sass build/CMakeFiles/fern_cuda.dir/src/cuda/$f.cu.o >"$OUT/sass/this.$f.sass" 2>/dev/null
  done
  for s in "$OUT"/sass/*.sass; do echo "== $(basename "$s")"; prewait "$s"; done >"$OUT/sass/prewait.txt"
  gzip -f "$OUT"/sass/*.sass
  note "SASS: loads before the PDL wait per kernel in sass/prewait.txt"
fi
# If the fused MoE failed its own tests, measure everything else with the three-launch MoE.
case "$fails" in *cuda_test_cuda_moe*) export FERN_CUDA_MOE_FUSED=0; note "fused MoE off for the benchmarks";; esac
what=$([ "$MODE" = quick ] && echo decode || echo steps)
FERN_CUDA_PDL=1 timeout $(left 100) ./build/bench/bench_cuda_decode $what 2>&1 | tee "$OUT/bench_decode.log"
note "bench_cuda_decode $what rc=${PIPESTATUS[0]} ($(elapsed))"
if [ "$MODE" = full ] && [ "${FERN_BENCH:-1}" = 1 ]; then
  timeout $(left 100) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 \
    --runs 3 >"$OUT/fern_bench.log" 2>&1
  note "fern bench rc=$? ($(elapsed))"
  tail -8 "$OUT/fern_bench.log"
fi
if [ "$MODE" = full ]; then
  pfails=""
  for t in cuda_test_cuda_moe cuda_test_cuda_forward; do
    [ $(left) -lt 15 ] && { pfails+=" $t(not run: time)"; continue; }
    FERN_CUDA_PDL=0 timeout $(left 100) ./build/$t >"$L/$t.pdl0.log" 2>&1 || pfails+=" $t"
  done
  note "PDL off: $(cat $L/*.pdl0.log 2>/dev/null | grep -c '^\[       OK') OK; failed or not run:${pfails:- none} ($(elapsed))"
  if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null && [ $(left) -ge 15 ]; then
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
