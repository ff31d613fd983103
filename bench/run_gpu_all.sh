#!/usr/bin/env bash
# The whole-engine check on the GPU machine in one call, from the repository root, with carry [".carry/debs",
# ".carry/node", ".carry/all-head.tar", ".carry/all-head.commit"] (bench/gpu_prelude.sh says how to make the
# archive; docs/GPU.md how to make .carry/node):
#   1. build (sm_90a), 2. every CUDA test, 3. the prefill-accuracy bisect (bench/cuda/bisect_prefill_accuracy.sh),
#   4. the Node server suite on the CUDA backend, 5. fern bench decode at 4K and 128K (3 runs) and prefill at 4K,
#   32K and 128K (2 runs, with the scratch it held), 6. fern eval of the CUDA backend against HF transformers on a
#   `small` synthetic checkpoint with peaked logits.
# Logs under $OUT; a summary last. Steps are skipped once the time budget (BUDGET seconds) is spent. Knobs: ALL_BISECT=0
# and ALL_EVAL=0 skip steps 3 and 6, ALL_NODE=0 skips step 4, ALL_DECODE=0 the decode bench, ALL_SERVED=0 the served
# decode (host loop at temperature 1: device and host picks, and eager steps); ALL_TESTS="names" runs
# only those CUDA test binaries; ALL_DECODE_ALT="VAR=VALUE" repeats the decode bench with that switch; ALL_MICRO=1
# adds the MoE and dense GEMM micro-benchmarks (ablation rows, tile-loop
# columns); ALL_GEMV=1 adds bench_cuda_decode's GEMV table (cold and warm L2); PREFILL_LENGTHS (default
# 4096,32768,131072) and PREFILL_RUNS (default 2); ALL_PREFILL_ALT="ARGS" runs fern bench prefill once more with those
# arguments (e.g. "--lengths 32768,131072 --prefill-chunk 16384 --runs 1").
set -u
BUDGET=${BUDGET:-560}
source bench/gpu_prelude.sh
left() { echo $(( BUDGET - ($(date +%s) - gpu_start) )); }
export PYTHONUNBUFFERED=1
gpu_unpack_head all-head
gpu_configure
MICRO=${ALL_MICRO:-0}
EXTRA=""
[ "$MICRO" = 1 ] && EXTRA="bench_cuda_moe_prefill bench_cuda_prefill_linear"
[ "${ALL_GEMV:-0}" = 1 ] && EXTRA="$EXTRA bench_cuda_decode"
[ "${ALL_SERVED:-1}" = 1 ] && EXTRA="$EXTRA bench_cuda_pick"
gpu_build fern $(gpu_cuda_test_targets) $EXTRA
if [ -n "${ALL_TESTS:-}" ]; then
  GPU_TEST_FAILS=""
  for t in $ALL_TESTS; do
    timeout "${TEST_TIMEOUT:-150}" "build/$t" >>"$OUT/cuda_tests.log" 2>&1 || GPU_TEST_FAILS+=" $t"
  done
  note "CUDA tests ($ALL_TESTS): $(grep -c '^\[       OK' "$OUT/cuda_tests.log") OK, failed:${GPU_TEST_FAILS:- none} ($(elapsed))"
  grep -B3 -A8 "Failure" "$OUT/cuda_tests.log" | head -40
else
  gpu_run_cuda_tests
fi
grep -E "^(synth small|chunk )" "$OUT/cuda_tests.log"
if [ "${ALL_BISECT:-1}" = 1 ]; then
  timeout 200 bash bench/cuda/bisect_prefill_accuracy.sh build >"$OUT/bisect.log" 2>&1
  note "prefill-accuracy bisect ($(elapsed)):"$'\n'"$(cat "$OUT/bisect.log")"
fi
[ "${ALL_NODE:-1}" = 1 ] && [ "$(left)" -gt 300 ] && gpu_run_node_suite 150
if [ "$MICRO" = 1 ]; then
  timeout 60 build/bench/bench_cuda_moe_prefill >"$OUT/bench_moe_prefill.md" 2>&1
  note "bench_cuda_moe_prefill rc $? ($(elapsed))"
  grep -E "^\| (T \||512|2048)" "$OUT/bench_moe_prefill.md" | head -32
fi
if [ "${ALL_GEMV:-0}" = 1 ]; then
  timeout 90 build/bench/bench_cuda_decode gemv >"$OUT/bench_gemv.md" 2>&1
  note "bench_cuda_decode gemv rc $? ($(elapsed))"
  grep -A12 "== GEMV" "$OUT/bench_gemv.md"
fi
if [ "${ALL_DECODE:-1}" = 1 ] && [ "$(left)" -gt 110 ]; then
  timeout 100 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 --runs 3 \
    --json "$OUT/decode.json" >"$OUT/bench_decode.log" 2>&1
  note "decode: $(grep -oE "decode ctx [0-9]+: [0-9.]+ tok/s" "$OUT/bench_decode.log" | tr "\n" " ") ($(elapsed))"
fi
# The served decode path at temperature 1 (the server's default), as a request through `fern serve` runs it:
# Engine::decode_pick, the step replayed from its record with the token picked on the device (FERN_CUDA_PICK=1) or
# the logits copied to the host and picked there (0), in one process; then the path before recorded steps (eager
# steps, host picks). ALL_SERVED=0 skips it.
if [ "${ALL_SERVED:-1}" = 1 ] && [ "$(left)" -gt 200 ]; then
  timeout 150 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths 4096,131072 --runs 3 \
    --host-loop --temperature 1 --decode-switch FERN_CUDA_PICK=1,0 --json "$OUT/decode_served.json" \
    >"$OUT/bench_decode_served.log" 2>&1
  note "decode served (T 1): $(grep -oE "decode ctx [0-9]+ FERN_CUDA_PICK=[01]: [0-9.]+ tok/s" "$OUT/bench_decode_served.log" | tr "\n" " ") ($(elapsed))"
  env FERN_DECODE_GRAPH=0 FERN_CUDA_PICK=0 timeout 100 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda \
    --phase decode --lengths 4096 --runs 3 --host-loop --temperature 1 >"$OUT/bench_decode_served_eager.log" 2>&1
  note "decode served eagerly, host picks (T 1): $(grep -oE "decode ctx [0-9]+: [0-9.]+ tok/s" "$OUT/bench_decode_served_eager.log" | tr "\n" " ") ($(elapsed))"
  timeout 60 build/bench/bench_cuda_pick >"$OUT/bench_pick.md" 2>&1
  note "bench_cuda_pick rc $? ($(elapsed))"
  grep -E "^\|" "$OUT/bench_pick.md"
fi
# ALL_DECODE_ALT="VAR=VALUE": the decode bench once more with that switch (a default under question, same call).
if [ -n "${ALL_DECODE_ALT:-}" ] && [ "$(left)" -gt 110 ]; then
  env "$ALL_DECODE_ALT" timeout 100 ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode \
    --lengths 4096,131072 --runs 3 >"$OUT/bench_decode_alt.log" 2>&1
  note "decode $ALL_DECODE_ALT: $(grep -oE "decode ctx [0-9]+: [0-9.]+ tok/s" "$OUT/bench_decode_alt.log" | tr "\n" " ") ($(elapsed))"
fi
if [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 15 )) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
    --lengths "${PREFILL_LENGTHS:-4096,32768,131072}" --runs "${PREFILL_RUNS:-2}" --json "$OUT/prefill.json" >"$OUT/bench_prefill.log" 2>&1
  grep -E "^\|" "$OUT/bench_prefill.log" | tail -5
  note "prefill: $(grep -oE "prefill [0-9]+ .chunks of [0-9]+.: [0-9.]+ tok/s" "$OUT/bench_prefill.log" | tr "\n" " ") ($(elapsed))"
fi
if [ -n "${ALL_PREFILL_ALT:-}" ] && [ "$(left)" -gt 60 ]; then
  # shellcheck disable=SC2086  # the knob holds several arguments
  timeout $(( $(left) - 15 )) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase prefill \
    $ALL_PREFILL_ALT >"$OUT/bench_prefill_alt.log" 2>&1
  grep -E "^\|" "$OUT/bench_prefill_alt.log" | tail -4
  note "prefill ($ALL_PREFILL_ALT): $(grep -oE "prefill [0-9]+ .chunks of [0-9]+.: [0-9.]+ tok/s" \
    "$OUT/bench_prefill_alt.log" | tr "\n" " ") ($(elapsed))"
fi
grep -h "scratch live at its peak" "$OUT"/bench_prefill*.log | tail -3
if [ "$MICRO" = 1 ]; then
  if [ "$(left)" -gt 40 ]; then
    timeout $(( $(left) - 20 )) build/bench/bench_cuda_prefill_linear >"$OUT/bench_prefill_linear.md" 2>&1
    note "bench_cuda_prefill_linear rc $? ($(elapsed))"
  fi
  grep -E "^\| (shape|gdn in_proj_qkv 8192x2048 \| (2048|4096)|out_proj 2048x4096 \| 2048|expert-size 512x2048 \| 2048)" \
    "$OUT/bench_prefill_linear.md"
fi
if [ "${ALL_EVAL:-1}" = 1 ] && [ "$(left)" -gt 90 ]; then
  ./build/fern synth --preset small --format mlx4 --seed 3 --logit-scale 8 --out /tmp/small >"$OUT/synth_small.log" 2>&1
  timeout 60 python3 tools/golden/hf_golden.py --ckpt /tmp/small --format mlx4 --out /tmp/hf_small \
    --lengths 64,128 --decode-steps 8 >"$OUT/hf_small.log" 2>&1
  ./build/fern eval --model /tmp/small --backend cuda --reference /tmp/hf_small --json "$OUT/eval_small.json" \
    >"$OUT/eval_small.log" 2>&1
  note "eval small (cuda vs HF transformers fp32): $(tail -1 "$OUT/eval_small.log")"
fi
gpu_summary
