#!/usr/bin/env bash
# One GPU call that says where the time goes, kernel by kernel, in `fern bench` prefill on the full-size synthetic
# model, from the repository root with carry [".carry/debs", ".carry/prof-head.tar", ".carry/prof-head.commit"]
# (make the archive as for the other scripts, bench/gpu_prelude.sh):
#  1. Nsight Compute's per-kernel duration over `fern bench --phase prefill` at PROF_PREFILL tokens (default 2,048;
#     one warm-up and one timed pass), summed per kernel, the top kernels with their share in the summary. (For the
#     decode step by block: bench_cuda_decode blocks.)
#  2. The random 8-layer whole-model check under each prefill tile loop (PROF_PIPES, default "q4 sync"), with the
#     per-row NMSE (worst row and median: one outlying row is a flipped near-tie, every row off is a kernel error).
#  3. PROF_NCU=1: bench/cuda/run_gpu_ncu.sh on this build (NCU_KERNELS as there).
# Everything lands in $OUT/profile.tar.gz (a call returns at most 8 files) and the summary.
set -u
source bench/gpu_prelude.sh
gpu_unpack_head prof-head
gpu_configure
gpu_build fern cuda_test_cuda_forward bench_cuda_prefill_linear bench_cuda_moe_prefill bench_cuda_decode
mkdir -p "$OUT/prof"
P=$OUT/prof
SYN=(--synth qwen3.6-35b-a3b --backend cuda)
# Nsight Systems is not installed on the GPU machine; Nsight Compute's per-kernel durations serve instead (kernels
# serialized, so the shares, not the sum, are the figure to read).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 300 "$NCU" --csv --metrics gpu__time_duration.sum ./build/fern bench "${SYN[@]}" --phase prefill \
  --lengths "${PROF_PREFILL:-2048}" --runs 1 >"$P/prefill_ncu.csv" 2>"$P/prefill_ncu.err"
note "ncu prefill rc $? ($(elapsed))"
python3 - "$P/prefill_ncu.csv" >"$P/prefill_top.txt" <<'EOF2'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
tot = {}
for r in csv.DictReader(lines):
    n = r["Kernel Name"].split("(")[0].split("<")[0][:48]
    tot[n] = tot.get(n, 0.0) + float(r["Metric Value"].replace(",", ""))
s = sum(v for n, v in tot.items() if "fill" not in n)
print(f"prefill (ncu, serialized, fill kernels excluded): {s/1e6:.1f} ms")
for n, v in sorted(tot.items(), key=lambda kv: -kv[1])[:18]:
    if "fill" not in n:
        print(f"  {v/1e6:9.2f} ms {100*v/s:5.1f}%  {n}")
EOF2
while IFS= read -r l; do note "$l"; done <"$P/prefill_top.txt"

for pipe in ${PROF_PIPES:-q4 sync}; do
  FERN_GEMM_WG_PIPE=$pipe timeout 200 ./build/cuda_test_cuda_forward --gtest_filter='*RandomModel*' >"$P/forward_$pipe.log" 2>&1
  note "forward ($pipe, rc $?): $(grep -E 'random 8-layer|prefill rows' "$P/forward_$pipe.log" | tr '\n' ' ' | sed -E 's/ +/ /g')"
done

if [ "${PROF_NCU:-0}" = 1 ]; then
  summary_before=$summary
  NCU_REUSE=1 bash bench/cuda/run_gpu_ncu.sh >"$P/ncu_run.log" 2>&1
  summary=$summary_before
  note "ncu: $(grep -c '^== ncu' "$P/ncu_run.log") kernels ($(elapsed))"
  grep -E '^==   ' "$P/ncu_run.log" | cut -c1-700 | while IFS= read -r l; do note "$l"; done
fi
rm -f /tmp/prof_*.sqlite
(cd "$OUT" && tar -czf profile.tar.gz prof ncu_reports.tar.gz 2>/dev/null; rm -rf prof ncu_reports.tar.gz)
gpu_summary
