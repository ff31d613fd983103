#!/usr/bin/env bash
# The whole-engine check on the GPU machine, in one call (from the repository root, carry [".carry"]):
#   1. full build (sm_90a), 2. CUDA tests, 3. the server's Node suite on the CUDA backend,
#   4. fern eval of the CUDA backend against HF transformers on a `small` synthetic checkpoint with peaked logits,
#   5. fern bench decode on the full-size synthetic model at the ten lengths of PERF.md, then a short prefill run.
# Everything is logged under $OUT; a summary is printed last. Steps are skipped once the time budget is spent.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
source tools/gpu-env.sh
export PYTHONUNBUFFERED=1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(git rev-parse --short=12 HEAD 2>/dev/null)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build -j16 >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
note "build: $(( $(date +%s) - start )) s"

timeout $(( $(left) / 4 )) ctest --test-dir build -L cuda -j4 >"$OUT/ctest_cuda.log" 2>&1
note "ctest -L cuda: $(grep -E 'tests passed|tests failed' "$OUT/ctest_cuda.log")"
timeout $(( $(left) / 3 )) ctest --test-dir build -L node -j2 --output-on-failure >"$OUT/ctest_node.log" 2>&1
note "ctest -L node (CUDA backend): $(grep -E 'tests passed|tests failed' "$OUT/ctest_node.log")"

if [ "$(left)" -gt 240 ]; then
  ./build/fern synth --preset small --format mlx4 --seed 3 --logit-scale 8 --out /tmp/small >"$OUT/synth_small.log" 2>&1
  timeout 150 python3 tools/golden/hf_golden.py --ckpt /tmp/small --format mlx4 --out /tmp/hf_small \
    --lengths 64,128 --decode-steps 8 >"$OUT/hf_small.log" 2>&1
  ./build/fern eval --model /tmp/small --backend cuda --reference /tmp/hf_small --json "$OUT/eval_small.json" \
    >"$OUT/eval_small.log" 2>&1
  note "eval small (cuda vs HF transformers fp32): $(tail -1 "$OUT/eval_small.log")"
fi
if [ "$(left)" -gt 120 ]; then
  timeout $(( $(left) - 60 )) ./build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --runs 3 \
    --steps 64 --json "$OUT/decode.json" --md "$OUT/decode.md" >"$OUT/bench_decode.log" 2>&1
  note "decode bench: $(grep -c '^| [0-9]' "$OUT/decode.md" 2>/dev/null) lengths"
  cat "$OUT/decode.md" 2>/dev/null
fi
echo
echo "$summary"
