#!/usr/bin/env bash
# One GPU call: the decode step's per-kernel timeline (bench_cuda_decode timeline, CUPTI) at TL_CONTEXTS (default
# 4096 and 131072), then `fern bench` prefill at PF_LENGTHS for each prefill chunk size of PF_CHUNKS (default
# 2048,4096,8192; 0 = the backend's choice; PF_LENGTHS= skips it), median of PF_RUNS; TL_SETS="A=1|A=2" runs each
# decode timeline once per set of environment assignments; TL_BENCH="NAME ..." runs those micro-benchmarks (after
# TL_TESTS); with DEC_LENGTHS, `fern bench`
# decode there (median of 3; DEC_SWITCH as --decode-switch, several separated by '|'). TL_TESTS: test executables to run first (NAME or NAME:GTEST_FILTER). PTL: prefill
# timelines (bench_cuda_decode prefill-timeline), a list of LEN:CHUNK, under each set of PTL_SETS. PF_SETS="A=1 B=2|A=3 B=4": the prefill bench
# once per set of environment assignments (one process each, in the order given). From the repository root with carry [".carry/debs",
# ".carry/tl-head.tar", ".carry/tl-head.commit"] (archive as bench/gpu_prelude.sh says). Files under $OUT.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head tl-head
gpu_configure
# shellcheck disable=SC2046,SC2086  # lists of names
gpu_build fern bench_cuda_decode ${TL_BENCH:-} $(gpu_test_names ${TL_TESTS:-})
gpu_run_test_specs ${TL_TESTS:-}  # NAME or NAME:GTEST_FILTER
for b in ${TL_BENCH:-}; do  # micro-benchmarks (build/bench/NAME), their tables in full
  timeout 300 "build/bench/$b" >"$OUT/timeline_bench_$b.md" 2>&1
  note "$b rc $? ($(elapsed))"
  cat "$OUT/timeline_bench_$b.md"
done
# TL_SETS="A=1|A=2": each decode timeline once per set of environment assignments (default: one, as is).
IFS='|' read -r -a tl_sets <<<"${TL_SETS:- }"
for set in "${tl_sets[@]}"; do
  tag=$(echo "$set" | tr -c 'A-Za-z0-9\n' '_')
  for c in ${TL_CONTEXTS:-4096 131072}; do
    # shellcheck disable=SC2086  # a set is several assignments
    env $set timeout 200 build/bench/bench_cuda_decode timeline "$c" "${TL_STEPS:-9}" "$OUT/timeline_${c}_$tag.txt" \
      >"$OUT/timeline_${c}_$tag.log" 2>&1
    note "timeline $c [$set] rc $? ($(elapsed))"
    grep -A40 "== decode step timeline" "$OUT/timeline_${c}_$tag.log" | head -45
  done
done
# PTL_SETS="A=1|A=2": each prefill timeline once per set of environment assignments (default: one, as is).
IFS='|' read -r -a ptl_sets <<<"${PTL_SETS:- }"
for set in "${ptl_sets[@]}"; do
  for lc in ${PTL:-}; do
    f="$OUT/timeline_pf_${lc/:/_}_$(echo "$set" | tr -c 'A-Za-z0-9\n' '_').log"
    # shellcheck disable=SC2086  # a set is several assignments
    env $set timeout 200 build/bench/bench_cuda_decode prefill-timeline "${lc%%:*}" "${lc##*:}" "${f%.log}.txt" \
      >"$f" 2>&1
    note "prefill timeline $lc [$set] rc $? ($(elapsed)): $(grep -m1 untraced "$f")"
    grep -A10 "== prefill timeline" "$f" | tail -8
    grep -A10 "longest idle gaps" "$f"
  done
done
if [ -n "${PF_SETS:-}" ]; then
  IFS='|' read -r -a sets <<<"$PF_SETS"
  i=0
  for set in "${sets[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086  # a set is several assignments
    env $set timeout "${PF_TIMEOUT:-300}" build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
      --lengths "${PF_LENGTHS:-4096,32768}" --prefill-chunk "${PF_CHUNKS:-0}" --runs "${PF_RUNS:-2}" \
      >"$OUT/prefill_set$i.md" 2>"$OUT/prefill_set$i.err"
    note "prefill [$set] rc $? ($(elapsed))"
    sed -n '/| length/,$p' "$OUT/prefill_set$i.md"
  done
elif [ -n "${PF_LENGTHS-4096,32768,131072}" ]; then
  timeout "${PF_TIMEOUT:-300}" build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
    --lengths "${PF_LENGTHS-4096,32768,131072}" --prefill-chunk "${PF_CHUNKS:-2048,4096,8192}" --runs "${PF_RUNS:-2}" \
    --json "$OUT/prefill.json" >"$OUT/prefill.md" 2>"$OUT/prefill.err"
  note "prefill rc $? ($(elapsed))"
  cat "$OUT/prefill.md"
fi
if [ -n "${DEC_LENGTHS:-}" ]; then  # DEC_SWITCH="A=0,1|B=x,y": one `fern bench` per switch, in the order given
  IFS='|' read -r -a switches <<<"${DEC_SWITCH:- }"
  i=0
  for sw in "${switches[@]}"; do
    i=$((i + 1))
    sw=${sw// /}
    timeout 300 build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths "$DEC_LENGTHS" \
      --runs 3 ${sw:+--decode-switch "$sw"} >"$OUT/decode$i.md" 2>"$OUT/decode$i.err"
    note "decode [$sw] rc $? ($(elapsed))"
    cat "$OUT/decode$i.md"
  done
fi
tar -C "$OUT" -czf "$OUT/timeline.tar.gz" $(cd "$OUT" && ls timeline_* prefill_* tests.log 2>/dev/null) && rm -f "$OUT"/timeline_*.txt "$OUT"/prefill_*
gpu_summary
