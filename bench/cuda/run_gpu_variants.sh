#!/usr/bin/env bash
# One GPU call that compares builds of the prefill tile loops side by side, from the repository root with carry
# [".carry/debs", ".carry/var"], the folder holding NAME.tar and NAME.commit for each NAME in VARIANTS (each made with
# `git archive -o .carry/var/NAME.tar COMMIT; git rev-parse --short=12 COMMIT >.carry/var/NAME.commit`); VFLAGS_NAME
# (e.g. VFLAGS_ab="-DFERN_SOME_SWITCH=1") sets that variant's CMAKE_CUDA_FLAGS, so two names may hold one commit.
# Every variant is built in its own folder (in parallel) with this tree's two GEMM micro-benchmarks (their
# FERN_BENCH_DEFAULT_ONLY mode: only the default path), then the benchmarks run ROUNDS times in turn (variant after
# variant, so that clock drift hits all alike). The variant FULL (default: the last) also runs the GEMM and MoE tests
# first (a hang check: TEST_TIMEOUT each); with FULL_BENCH=1 every variant runs `fern bench --phase prefill` at
# PREFILL_LENGTHS (BENCH_RUNS runs each, default 2), one variant after the other.
# VSRC_NAME=OTHER makes NAME a runtime variant: no build of its own, OTHER's binaries run with the environment
# assignments of VENV_NAME (e.g. VSRC_seq8=v1 VENV_seq8="FERN_GEMM_SEQ=8"), so a switch is timed beside the builds.
# A table of the key rows per variant and round last.
set -u
source bench/gpu_prelude.sh
VARIANTS=${VARIANTS:-base v1 v2}
FULL=${FULL:-${VARIANTS##* }}
source tools/gpu-env.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); variants: $VARIANTS (full: $FULL)"
for v in $VARIANTS; do fv="VFLAGS_$v"; [ -n "${!fv:-}" ] && note "$v: CMAKE_CUDA_FLAGS=${!fv}"; done
TESTS="cuda_test_cuda_linear_gemm cuda_test_cuda_moe_prefill"
build_variant() {
  local v=$1 d=/tmp/v_$1 targets="bench_cuda_prefill_linear bench_cuda_moe_prefill"
  [ "$v" = "$FULL" ] && targets="$targets $TESTS cuda_test_cuda_forward"
  [ "${FULL_BENCH:-0}" = 1 ] && targets="$targets fern"
  local flags_var="VFLAGS_$v"
  # This tree's two GEMM benchmarks (their FERN_BENCH_DEFAULT_ONLY mode) into the variant's sources, then its build.
  # shellcheck disable=SC2086  # targets: several words
  GPU_TREE_OVERLAY="bench/cuda/bench_cuda_prefill_linear.cpp bench/cuda/bench_cuda_moe_prefill.cpp bench/cuda/bench_timing.h" \
    gpu_build_tree "$v" "$d" 8 "${!flags_var:-}" $targets
}
vsrc() { local s="VSRC_$1"; echo "${!s:-}"; }  # the variant whose build a runtime variant runs (empty: its own)
bindir() { local s; s=$(vsrc "$1"); echo "/tmp/v_${s:-$1}"; }
venv() { local e="VENV_$1"; echo "${!e:-}"; }
for v in $VARIANTS; do [ -z "$(vsrc "$v")" ] && build_variant "$v" & done
wait
for v in $VARIANTS; do
  [ -n "$(vsrc "$v")" ] && { note "$v: $(vsrc "$v")'s build with $(venv "$v")"; continue; }
  note "build $v: $(grep -cE 'FAILED|error' "$OUT/build_$v.log") error lines ($(elapsed))"
  grep -E "error|FAILED" "$OUT/build_$v.log" | head -5
done

d=/tmp/v_$FULL
GPU_TEST_FAILS=""
for t in $TESTS cuda_test_cuda_forward; do
  timeout "${TEST_TIMEOUT:-120}" "$d/build/$t" >"$OUT/${t}_$FULL.log" 2>&1 || GPU_TEST_FAILS+=" $t"
  note "$FULL $t: $(grep -c '^\[       OK' "$OUT/${t}_$FULL.log") OK, $(grep -c '^\[  FAILED' "$OUT/${t}_$FULL.log") FAILED lines ($(elapsed))"
  grep -B2 -A6 "Failure" "$OUT/${t}_$FULL.log" | head -20
done
grep -hE "^(random|  prefill rows)" "$OUT/cuda_test_cuda_forward_$FULL.log" | while IFS= read -r l; do note "$FULL: $l"; done
if [ -n "$GPU_TEST_FAILS" ]; then note "tests failed:$GPU_TEST_FAILS"; fi

for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in $VARIANTS; do
    # shellcheck disable=SC2046  # VENV_: several assignments
    (cd "$(bindir "$v")" && env $(venv "$v") FERN_BENCH_DEFAULT_ONLY=1 timeout 60 build/bench/bench_cuda_prefill_linear \
       >"$OUT/lin_${v}_$r.md" 2>&1
     env $(venv "$v") FERN_BENCH_DEFAULT_ONLY=1 timeout 60 build/bench/bench_cuda_moe_prefill >"$OUT/moe_${v}_$r.md" 2>&1)
  done
done
note "benchmarks done ($(elapsed))"
# Per variant and round: dense qkv at 2,048 / 4,096 rows, out_proj at 2,048, lm_head at 1,024, MoE block at 512 / 2,048.
for v in $VARIANTS; do
  for r in $(seq 1 "${ROUNDS:-2}"); do
    q2=$(awk -F'|' '/in_proj_qkv 8192x2048 \| 2048 /{print $11}' "$OUT/lin_${v}_$r.md" | tr -d ' ')
    q4=$(awk -F'|' '/in_proj_qkv 8192x2048 \| 4096 /{print $11}' "$OUT/lin_${v}_$r.md" | tr -d ' ')
    op=$(awk -F'|' '/out_proj 2048x4096 \| 2048 /{print $11}' "$OUT/lin_${v}_$r.md" | tr -d ' ')
    lm=$(awk -F'|' '/lm_head 248320x2048 \| 1024 /{print $11}' "$OUT/lin_${v}_$r.md" | tr -d ' ')
    m5=$(awk -F'|' '/^\| 512 \| grouped, default/{print $4}' "$OUT/moe_${v}_$r.md" | tr -d ' ')
    m2=$(awk -F'|' '/^\| 2048 \| grouped, default/{print $4}' "$OUT/moe_${v}_$r.md" | tr -d ' ')
    note "$v round $r: qkv@2048 $q2 qkv@4096 $q4 out_proj@2048 $op lm_head@1024 $lm | MoE T=512 $m5 T=2048 $m2 (ms)"
  done
done
if [ "${FULL_BENCH:-0}" = 1 ]; then  # every variant, in turn
  for v in $VARIANTS; do
    # shellcheck disable=SC2046
    env $(venv "$v") timeout "${BENCH_TIMEOUT:-150}" "$(bindir "$v")/build/fern" bench --synth qwen3.6-35b-a3b \
      --backend cuda --phase prefill --lengths "${PREFILL_LENGTHS:-4096,32768}" --runs "${BENCH_RUNS:-2}" >"$OUT/bench_prefill_$v.log" 2>&1
    note "$v fern bench prefill rc $?: $(grep -E '^\| [0-9]' "$OUT/bench_prefill_$v.log" | awk -F'|' '{printf "%s: %s tok/s; ", $2, $4}')"
  done
fi
(cd "$OUT" && tar -czf variants_logs.tar.gz *.md *.log 2>/dev/null && rm -f *.md *.log)
note "total $(elapsed)"
gpu_summary
