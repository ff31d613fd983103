#!/usr/bin/env bash
# Several commits compared side by side in one GPU call, from the repository root with carry [".carry/debs",
# ".carry/var"]: for each NAME of TREES, .carry/var/NAME.tar and NAME.commit (`git archive -o .carry/var/NAME.tar
# COMMIT; git rev-parse --short=12 COMMIT >.carry/var/NAME.commit`), built in /tmp/v_NAME, all at once (JOBS ninja
# jobs each, default 16 / number of trees), with the TESTS, the BENCH_TARGETS and (for the benches below) fern. Then:
#  - TESTS (test executables, e.g. "cuda_test_cuda_gdn cuda_test_cuda_forward") on every tree, and the lines of each
#    test's output that report an error figure (NMSE, top-1) compared with the first tree's: where a change keeps the
#    arithmetic, every line of the first tree should be found in the others (same bits, in practice);
#  - ROUNDS rounds (default 2), tree after tree within a round: BENCH (a command run in each tree's root, e.g.
#    "build/bench/bench_cuda_gdn_prefill 4096 32768"; BENCH_GREP picks its lines for the summary), then `fern bench`
#    prefill at PF_LENGTHS and decode at DEC_LENGTHS (either empty: skipped; 3 runs each, median).
# VFLAGS_NAME sets a tree's CMAKE_CUDA_FLAGS (two names may hold one commit). A short summary last; every log packed
# into $OUT/trees_logs.tar.gz.
set -u
source bench/gpu_prelude.sh
source tools/gpu-env.sh
TREES=${TREES:-base head}
TESTS=${TESTS:-}
BENCH=${BENCH:-}
BENCH_GREP=${BENCH_GREP:-.}
PF_LENGTHS=${PF_LENGTHS-4096,32768}
DEC_LENGTHS=${DEC_LENGTHS-}
read -r -a trees <<<"$TREES"
JOBS=${JOBS:-$(( 16 / ${#trees[@]} > 0 ? 16 / ${#trees[@]} : 1 ))}
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); trees: $TREES"
targets="$TESTS ${BENCH_TARGETS:-}"
[ -n "$PF_LENGTHS$DEC_LENGTHS" ] && targets="fern $targets"
for v in "${trees[@]}"; do
  fv="VFLAGS_$v"
  # shellcheck disable=SC2086  # targets: several words
  gpu_build_tree "$v" "/tmp/v_$v" "$JOBS" "${!fv:-}" $targets &
done
wait
for v in "${trees[@]}"; do
  fv="VFLAGS_$v"
  note "build $v ($(cat ".carry/var/$v.commit")${!fv:+, CUDA flags ${!fv}}): $(grep -cE 'FAILED|error:' "$OUT/build_$v.log") error lines ($(elapsed))"
done

first=${trees[0]}
for t in $TESTS; do
  for v in "${trees[@]}"; do
    timeout "${TEST_TIMEOUT:-300}" "/tmp/v_$v/build/$t" >"$OUT/test_${t}_$v.log" 2>&1
    note "$v $t rc $?: $(grep -c '^\[       OK' "$OUT/test_${t}_$v.log") OK, $(grep -c '^\[  FAILED' "$OUT/test_${t}_$v.log") FAILED lines ($(elapsed))"
    grep -iE "nmse|top-1" "$OUT/test_${t}_$v.log" | grep -v " ms)" >"/tmp/figures_${t}_$v.txt"
  done
  for v in "${trees[@]:1}"; do
    note "$t: $(grep -cvxFf "/tmp/figures_${t}_$v.txt" "/tmp/figures_${t}_$first.txt") of $(wc -l <"/tmp/figures_${t}_$first.txt") error-figure lines of $first not in $v"
  done
done

for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in "${trees[@]}"; do
    d=/tmp/v_$v
    if [ -n "$BENCH" ]; then
      # shellcheck disable=SC2086  # BENCH: a command line
      (cd "$d" && timeout "${BENCH_TIMEOUT:-200}" $BENCH) >"$OUT/bench_${v}_$r.log" 2>&1
      note "$v r$r bench: $(grep -E "$BENCH_GREP" "$OUT/bench_${v}_$r.log" | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
    fi
    if [ -n "$PF_LENGTHS" ]; then
      (cd "$d" && timeout 300 build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
        --lengths "$PF_LENGTHS" --runs 3) >"$OUT/prefill_${v}_$r.log" 2>&1
      note "$v r$r prefill: $(grep -E '^\| [0-9]+ ' "$OUT/prefill_${v}_$r.log" | awk -F'|' '{printf "%s:%s tok/s; ", $2, $4}') ($(elapsed))"
    fi
    if [ -n "$DEC_LENGTHS" ]; then
      (cd "$d" && timeout 300 build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode \
        --lengths "$DEC_LENGTHS" --runs 3) >"$OUT/decode_${v}_$r.log" 2>&1
      note "$v r$r decode: $(grep -E '^\| [0-9]+ ' "$OUT/decode_${v}_$r.log" | awk -F'|' '{printf "%s:%s tok/s; ", $2, $3}') ($(elapsed))"
    fi
  done
done
(cd "$OUT" && tar -czf trees_logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log)
note "total $(elapsed)"
gpu_summary
