#!/usr/bin/env bash
# One GPU call that compares decode builds of one commit that differ in compile-time switches of single CUDA files,
# without a full build per variant: the commit (carry .carry/tl-head.tar / .commit, bench/gpu_prelude.sh) is built
# once, then each variant NAME of DV_VARIANTS is a copy of that build folder whose build.ninja adds DV_FLAGS_NAME to
# the compile commands of the files in DV_FILES_NAME (e.g. DV_FILES_x="linear.cu" DV_FLAGS_x="-DFERN_SOME_PROBE"),
# so ninja recompiles only those (all variants in parallel). DV_ALT_NAME=ARCHIVE (.carry/ARCHIVE.tar, made as
# tl-head's) compiles those files from that commit's tree instead (their own folder's headers with them), e.g. the
# MoE kernel of main beside a branch's: DV_FILES_main="moe_fused.cu" DV_ALT_main=main-head. DV_TESTS (NAME or
# NAME:FILTER) run on the base build first. Then DV_ROUNDS rounds of `fern bench` decode at DV_LENGTHS (median of 3
# each), the variants in turn (base with --decode-switch DV_SWITCH when set), and a 4K timeline of each variant
# (bench_cuda_decode timeline; the sets of DV_TL_SETS="A=1|A=2" on the base build). From the repository root with
# carry [".carry/debs", ".carry/tl-head.tar", ".carry/tl-head.commit"] (and the DV_ALT archives); a table last.
# DV_BLOCKS: further variants (same DV_FILES_/DV_FLAGS_ form) that are only built and run `bench_cuda_decode blocks`
# once, after the rounds (e.g. DV_FLAGS_ph=-DFERN_MOE_PHASE_TIMING: the fused MoE's phase tables).
set -u
source bench/gpu_prelude.sh
gpu_unpack_head tl-head
gpu_configure
# shellcheck disable=SC2046,SC2086  # lists of names
gpu_build fern bench_cuda_decode $(gpu_test_names ${DV_TESTS:-})
flags_of() { local f="DV_FLAGS_$1"; echo "${!f:-}"; }
files_of() { local f="DV_FILES_$1"; echo "${!f:-}"; }
make_variant() {  # NAME: build_NAME = build with the variant's flags on its files
  local v=$1 d=build_$1
  local alt="DV_ALT_$1" src=$PWD/src/cuda
  rm -rf "$d" && cp -a build "$d" || return 1
  if [ -n "${!alt:-}" ]; then
    rm -rf "/tmp/alt_$v" && mkdir -p "/tmp/alt_$v" && tar -C "/tmp/alt_$v" -xf ".carry/${!alt}.tar" || return 1
  fi
  for f in $(files_of "$v"); do  # that object's build statement: its FLAGS line, its source
    awk -v obj="src/cuda/$f.o:" -v add=" $(flags_of "$v")" -v from="$src/$f" -v to="${!alt:+/tmp/alt_$v/src/cuda/$f}" '
      index($0, "build ") == 1 && index($0, obj) > 0 { hit = 1; if (to != "") sub(from, to) }
      hit && /^  FLAGS = / { $0 = $0 add; hit = 0 }
      { print }' "$d/build.ninja" >"$d/build.ninja.new" && mv "$d/build.ninja.new" "$d/build.ninja"
  done
  ninja -C "$d" -j8 fern bench_cuda_decode >"$OUT/build_$v.log" 2>&1
}
for v in ${DV_VARIANTS:-} ${DV_BLOCKS:-}; do make_variant "$v" & done
# shellcheck disable=SC2086
gpu_run_test_specs ${DV_TESTS:-}  # beside the variants' compiles
grep -B3 -A8 "Failure" "$OUT/tests.log" | head -30
wait
for v in ${DV_VARIANTS:-} ${DV_BLOCKS:-}; do
  alt="DV_ALT_$v"
  note "variant $v ($(flags_of "$v") on $(files_of "$v")${!alt:+ from ${!alt}}):" \
    "ninja $(grep -o '^\[[0-9]*/[0-9]*\]' "$OUT/build_$v.log" | tail -1)," \
    "$(grep -cE 'FAILED|error' "$OUT/build_$v.log") error lines ($(elapsed))"
done
for r in $(seq "${DV_ROUNDS:-2}"); do
  for v in base ${DV_VARIANTS:-}; do
    d=build
    [ "$v" != base ] && d=build_$v
    sw=""
    [ "$v" = base ] && sw=${DV_SWITCH:-}
    timeout 250 "$d/fern" bench --synth qwen3.6-35b-a3b --backend cuda --phase decode \
      --lengths "${DV_LENGTHS:-4096,131072}" --runs 3 ${sw:+--decode-switch "$sw"} \
      >"$OUT/decode_${v}_$r.md" 2>"$OUT/decode_${v}_$r.err"
    # the rows' first three cells: context | tok/s | min-max, or context | switch value | tok/s
    note "decode $v round $r: $(grep -E '^\| [0-9]' "$OUT/decode_${v}_$r.md" | cut -d'|' -f2-4 | tr -s ' ' |
      paste -sd';') ($(elapsed))"
  done
done
IFS='|' read -r -a tl_sets <<<"${DV_TL_SETS:- }"
for v in base ${DV_VARIANTS:-}; do
  d=build
  [ "$v" != base ] && d=build_$v
  for set in "${tl_sets[@]}"; do
    [ "$v" != base ] && [ "$set" != "${tl_sets[0]}" ] && continue  # the sets on the base build only
    tag=${v}_$(echo "$set" | tr -c 'A-Za-z0-9\n' '_')
    # shellcheck disable=SC2086  # a set is several assignments
    env $set timeout 120 "$d/bench/bench_cuda_decode" timeline 4096 9 "$OUT/timeline_$tag.txt" \
      >"$OUT/timeline_$tag.log" 2>&1
    note "timeline $v [$set]: $(grep -m1 '^step:' "$OUT/timeline_$tag.log")"
    grep -E "^(moe|linear|gdn|attn)" "$OUT/timeline_$tag.log" | head -12
  done
done
for v in ${DV_BLOCKS:-}; do
  timeout 200 "build_$v/bench/bench_cuda_decode" blocks >"$OUT/blocks_$v.txt" 2>&1
  note "blocks $v: rc $? ($(elapsed))"
  awk '/^== fused MoE phases/ { on = 1 } on && NF == 0 { on = 0 } on' "$OUT/blocks_$v.txt" | cut -c1-110
done
tar -C "$OUT" -czf "$OUT/dv.tar.gz" $(cd "$OUT" && ls timeline_* decode_* build_*.log blocks_* 2>/dev/null) &&
  (cd "$OUT" && rm -f timeline_* decode_* build_*.log blocks_*)
gpu_summary
