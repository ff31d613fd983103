#!/usr/bin/env bash
# One GPU-machine call for the side-by-side comparison (and, in `shakeout` mode, the Node server suite against the
# CUDA backend). From the repository root, with carry [".carry/debs", ".carry/node"]:
#   bash bench/compare/run_gpu_compare.sh shakeout   # small checkpoint, one round, + the Node suite on the GPU
#   bash bench/compare/run_gpu_compare.sh full       # full-size checkpoint, the ten lengths, three rounds
# .carry/node holds node.xz (the node binary, xz-compressed) and npm-min.tar.xz (node_modules/openai and the
# tokenizer data), made as docs/GPU.md says. Results and logs under $OUT, a summary last.
set -u
mode=${1:-shakeout}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
elapsed() { echo $(( $(date +%s) - start )); }
source tools/gpu-env.sh
if [ -f .carry/node/node.xz ]; then
  mkdir -p /tmp/nodebin && xz -dc .carry/node/node.xz >/tmp/nodebin/node && chmod +x /tmp/nodebin/node
  export PATH=/tmp/nodebin:$PATH
  mkdir -p third_party/npm && tar -C third_party/npm -xJf .carry/node/npm-min.tar.xz
fi
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(git rev-parse --short=12 HEAD 2>/dev/null) node $(node --version 2>/dev/null || echo none)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
# TESTS=1: also build and run every CUDA test first (the whole tree's check in the same call).
targets=fern
[ "${TESTS:-0}" = 1 ] && targets="fern $(ninja -C build -t targets all | grep -o '^cuda_test_[a-z_]*' | sort -u | tr '\n' ' ')"
ninja -C build -j16 $targets >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
note "build: $(elapsed) s"
if [ "${TESTS:-0}" = 1 ]; then
  fails=""
  for t in build/cuda_test_*; do
    [ -x "$t" ] || continue
    timeout 120 "$t" >>"$OUT/cuda_tests.log" 2>&1 || fails+=" $(basename "$t")"
  done
  note "CUDA tests: $(grep -c '^\[       OK' "$OUT/cuda_tests.log") OK, failed:${fails:- none} ($(elapsed) s)"
  grep -E "^chunk " "$OUT/cuda_tests.log"
  grep -B3 -A8 "Failure" "$OUT/cuda_tests.log" | head -40
fi
if [ "$mode" = shakeout ]; then
  if command -v node >/dev/null; then
    # The suite starts `fern serve` with the demo model and the default backend (auto); this line shows which one.
    ./build/fern serve --port 0 >/tmp/serve.txt 2>&1 &
    pid=$!
    for i in $(seq 60); do grep -q serving /tmp/serve.txt && break; sleep 0.5; done
    kill $pid; wait $pid 2>/dev/null
    note "fern serve says: $(grep -m1 serving /tmp/serve.txt)"
    FERN_BIN=$PWD/build/fern timeout 300 node --test tests/server/*.test.mjs >"$OUT/node_suite.log" 2>&1
    note "Node server suite on the GPU (rc $?): $(grep -E '^# (tests|pass|fail)' "$OUT/node_suite.log" | tr '\n' ' ') ($(elapsed) s)"
    grep -m3 -E "backend (cuda|cpu)" "$OUT/node_suite.log"
    grep -B2 -A12 "^not ok" "$OUT/node_suite.log" | head -40
  fi
  ./build/fern synth --preset small --format mlx4 --out /tmp/ck >"$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
  python3 bench/compare/compare.py --fern build/fern --ckpt /tmp/ck --lengths 256,1024 --hf-lengths 256,1024 \
    --rounds 1 --steps 16 --hf-steps 4 --out "$OUT/compare_small.json" --md "$OUT/compare_small.md" 2>&1 |
    tee "$OUT/compare_small.log" | tail -12
  note "compare (small) rc ${PIPESTATUS[0]} ($(elapsed) s)"
else
  t=$(date +%s)
  ./build/fern synth --preset qwen3.6-35b-a3b --format mlx4 --out /tmp/q36 >"$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
  note "full-size mlx4 checkpoint written in $(( $(date +%s) - t )) s ($(du -sh /tmp/q36 | cut -f1))"
  python3 bench/compare/compare.py --fern build/fern --ckpt /tmp/q36 --rounds ${ROUNDS:-3} \
    --lengths ${LENGTHS:-256,512,1024,2048,4096,8192,16384,32768,65536,131072} \
    --prefill-lengths ${PREFILL_LENGTHS:-256,512,1024,2048,4096,8192,16384,32768} \
    --hf-lengths ${HF_LENGTHS:-256,512,1024,2048,4096} \
    --out "$OUT/compare.json" --md "$OUT/compare.md" 2>&1 | tee "$OUT/compare.log" | tail -16
  note "compare (full) rc ${PIPESTATUS[0]} ($(elapsed) s)"
fi
echo "== SUMMARY"; printf "%s" "$summary"
