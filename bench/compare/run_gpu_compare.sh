#!/usr/bin/env bash
# One GPU-machine call for the side-by-side comparison (and, in `shakeout` mode, the Node server suite against the
# CUDA backend). From the repository root, with carry [".carry/debs", ".carry/node"] plus, to build an exact commit,
# ".carry/compare-head.tar" and ".carry/compare-head.commit" (bench/gpu_prelude.sh says how):
#   bash bench/compare/run_gpu_compare.sh shakeout   # small checkpoint, one round, + the Node suite on the GPU
#   bash bench/compare/run_gpu_compare.sh full       # full-size checkpoint, the ten lengths, three rounds
# .carry/node holds node.xz and npm-min.tar.xz (docs/GPU.md). TESTS=1 also builds and runs every CUDA test first;
# TESTS=whole only the whole-model ones and the attention prefill's (cuda_test_cuda_forward,
# cuda_test_cuda_prefill_chunks, cuda_test_cuda_attn_prefill: ~100 s).
# COMPARE_BUDGET (seconds, default 380) stops compare.py before a round that would pass it (each round's table is
# written as it ends), so that the call stays inside the device's 10-minute limit.
# Results and logs under $OUT, a summary last; the chart (compare.png) where the machine has gnuplot, else
# tools/plot_bench.sh compare.png compare.json on the development machine.
set -u
mode=${1:-shakeout}
source bench/gpu_prelude.sh
gpu_unpack_head compare-head
gpu_configure
if [ "${TESTS:-0}" = 1 ]; then
  gpu_build fern $(gpu_cuda_test_targets)
  gpu_run_cuda_tests
  grep -E "^chunk " "$OUT/cuda_tests.log"
elif [ "${TESTS:-0}" = whole ]; then
  gpu_build fern cuda_test_cuda_forward cuda_test_cuda_prefill_chunks cuda_test_cuda_attn_prefill
  gpu_run_cuda_tests
  grep -E "^(synth small|chunk |peaked softmax)" "$OUT/cuda_tests.log"
else
  gpu_build fern
fi
if [ "$mode" = shakeout ]; then
  if command -v node >/dev/null; then
    # The suite starts `fern serve` with the demo model and the default backend (auto); this line shows which one.
    ./build/fern serve --port 0 >/tmp/serve.txt 2>&1 &
    pid=$!
    for i in $(seq 60); do grep -q serving /tmp/serve.txt && break; sleep 0.5; done
    kill $pid; wait $pid 2>/dev/null
    note "fern serve says: $(grep -m1 serving /tmp/serve.txt)"
    gpu_run_node_suite 300
  fi
  ./build/fern synth --preset small --format mlx4 --out /tmp/ck >"$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
  python3 bench/compare/compare.py --fern build/fern --ckpt /tmp/ck --lengths 256,1024 --hf-lengths 256,1024 \
    --rounds 1 --steps 16 --hf-steps 4 --out "$OUT/compare_small.json" --md "$OUT/compare_small.md" 2>&1 |
    tee "$OUT/compare_small.log" | tail -12
  note "compare (small) rc ${PIPESTATUS[0]} ($(elapsed))"
else
  t=$(date +%s)
  ./build/fern synth --preset qwen3.6-35b-a3b --format mlx4 --out /tmp/q36 >"$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
  note "full-size mlx4 checkpoint written in $(( $(date +%s) - t )) s ($(du -sh /tmp/q36 | cut -f1))"
  python3 bench/compare/compare.py --fern build/fern --ckpt /tmp/q36 --rounds ${ROUNDS:-3} \
    --lengths ${LENGTHS:-256,512,1024,2048,4096,8192,16384,32768,65536,131072} \
    --prefill-lengths ${PREFILL_LENGTHS:-256,512,1024,2048,4096,8192,16384,32768} \
    --hf-lengths ${HF_LENGTHS:-256,512,1024,2048,4096,8192,16384,32768} \
    --budget-s ${COMPARE_BUDGET:-380} --out "$OUT/compare.json" --md "$OUT/compare.md" 2>&1 | tee "$OUT/compare.log" | tail -16
  note "compare (full) rc ${PIPESTATUS[0]} ($(elapsed))"
  # The chart needs gnuplot (and node): drawn here when the machine has both, else from compare.json elsewhere.
  if command -v gnuplot >/dev/null && command -v node >/dev/null; then
    tools/plot_bench.sh "$OUT/compare.png" "$OUT/compare.json" >/dev/null && note "chart: compare.png"
  fi
fi
gpu_summary
