#!/usr/bin/env bash
# One GPU call that profiles the prefill tile loops with Nsight Compute (docs/notes/cuda-prefill-v5-ws.md), from the
# repository root with carry [".carry/debs", ".carry/gemm-head.tar", ".carry/gemm-head.commit"]: builds the two GEMM
# micro-benchmarks and profiles the first launch of each kernel named in NCU_KERNELS (regular expressions on the
# mangled names, each optionally followed by :N launches to skip; default: the exact-code loop's (q4b) dense 128-token
# kernel and the MoE block's 128-row gate/up and down kernels, at their first launch; `decode:REGEX` profiles a
# kernel of bench_cuda_decode's 4K step, e.g. decode:moe_fused_kernel:40, `gemv:REGEX` one of its GEMV table,
# `attn:REGEX` one of the attention prefill micro-benchmark, e.g. attn:attn_prefill_kernel, `gdn:REGEX` one of the
# GDN prefill micro-benchmark at NCU_GDN_T rows (default 8,192), e.g. gdn:gdn_chunk_prep_kernel) with the
# "full" section set and the per-instruction stall samples. Text reports (details, and the SASS source page with
# the stall samples as CSV) packed into $OUT/ncu_reports.tar.gz, the key metrics in the summary.
set -u
source bench/gpu_prelude.sh
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
note "ncu: ${NCU:-none}"
[ -n "$NCU" ] || { gpu_summary; exit 1; }
if [ -x /tmp/w/build/bench/bench_cuda_moe_prefill ] && [ "${NCU_REUSE:-0}" = 1 ]; then
  cd /tmp/w  # a warm machine's earlier build of the same archive
else
  gpu_unpack_head gemm-head
  gpu_configure
  gpu_build bench_cuda_prefill_linear bench_cuda_moe_prefill bench_cuda_decode bench_cuda_attn_prefill \
    bench_cuda_gdn_prefill
fi
KERNELS=${NCU_KERNELS:-"linear:gemm_wg_kernelILi4ELi128ELi5ELi4E moe:gate_up_wg_kernelILi4ELi128ELi5ELi4E moe:down_wg_kernelILi4ELi128ELi5ELi4E"}
for kv in $KERNELS; do
  b=${kv%%:*}; k=${kv#*:}; skip=0
  case "$k" in *:*) skip=${k##*:}; k=${k%:*} ;; esac  # bench:regex[:launches to skip]
  case "$b" in  # bench names: linear, moe, attn (prefill micro-benchmarks), decode (the 4K step by block), gemv
    moe) exe=(build/bench/bench_cuda_moe_prefill) ;;
    decode) exe=(build/bench/bench_cuda_decode blocks) ;;
    gemv) exe=(build/bench/bench_cuda_decode gemv) ;;  # the GEMV table (its first launch: in_proj_qkv, eager)
    attn) exe=(build/bench/bench_cuda_attn_prefill) ;;
    gdn) exe=(build/bench/bench_cuda_gdn_prefill "${NCU_GDN_T:-8192}") ;;  # one layer's GDN core at T rows
    *) exe=(build/bench/bench_cuda_prefill_linear) ;;
  esac
  out="$OUT/ncu_$(echo "$k" | tr -c 'A-Za-z0-9' '_' | cut -c1-60).txt"
  # The full set (warp-state sampling per instruction) into a report, then its details and its SASS source page
  # with the per-instruction stall samples (CSV).
  rep=/tmp/rep_$(basename "$out" .txt)
  timeout 120 "$NCU" --set full --kernel-name-base mangled -k "regex:$k" --launch-skip "$skip" -c 1 -f -o "$rep" "${exe[@]}" >"$out.run" 2>&1
  note "ncu $k rc $? ($(elapsed))"
  "$NCU" -i "$rep.ncu-rep" --page details --print-details all >"$out" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"${out%.txt}.sass.csv.gz"
  grep -E "^    (Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|Mem Busy|Max Bandwidth|Shared Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Grid Size|Block Size) " "$out" |
    sed -E 's/ +/ /g' | tr '\n' ';' | cut -c1-900 | { read -r l; note "  $l"; }
  grep -E "Stall|stall" "$out" | head -12 >>"$OUT/stalls.txt"
done
# At most 8 files come back from a call (docs/GPU.md): the reports travel as one archive.
(cd "$OUT" && tar -czf ncu_reports.tar.gz ncu_* stalls.txt 2>/dev/null && rm -f ncu_*.txt ncu_*.txt.run ncu_*.csv.gz stalls.txt)
gpu_summary
