#!/usr/bin/env bash
# Draws tok/s against length for decode and prefill from `fern bench --json` files (and, when given, the
# comparison harness's JSON with the HF baseline) into a PNG with gnuplot (Debian package gnuplot-nox).
#   tools/plot_bench.sh OUT.png FERN.json [COMPARE.json]
#   tools/plot_bench.sh OUT.png COMPARE.json          (fern's and HF's numbers of one comparison run)
set -euo pipefail
out=$1; fern_json=$2; cmp_json=${3:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Extract "length tok/s" columns with node (already a dependency), one file per phase and engine.
node -e '
const fs = require("fs");
const [fernPath, cmpPath, dir] = process.argv.slice(1);
const put = (name, rows) => fs.writeFileSync(`${dir}/${name}.dat`, rows.map(r => r.join(" ")).join("\n") + "\n");
const f = JSON.parse(fs.readFileSync(fernPath));
// `fern bench` rows name the decode length "context"; the comparison JSON holds rows with "length" under "fern".
const rows = f.results ? f.results.map(r => ({ ...r, length: r.context ?? r.length })) : f.fern;
put("fern_decode", rows.filter(r => r.phase === "decode").map(r => [r.length, r.tok_s_median]));
put("fern_prefill", rows.filter(r => r.phase === "prefill").map(r => [r.length, r.tok_s_median]));
if (cmpPath || f.hf) {
  const c = cmpPath ? JSON.parse(fs.readFileSync(cmpPath)) : f;
  put("hf_decode", (c.hf || []).filter(r => r.phase === "decode").map(r => [r.length, r.tok_s_median]));
  put("hf_prefill", (c.hf || []).filter(r => r.phase === "prefill").map(r => [r.length, r.tok_s_median]));
}
' "$fern_json" "$cmp_json" "$tmp"
plot_phase() {  # phase, title
  local p="\"$tmp/fern_$1.dat\" using 1:2 with linespoints lw 2 title \"fern\""
  if [ -s "$tmp/hf_$1.dat" ]; then p="$p, \"$tmp/hf_$1.dat\" using 1:2 with linespoints lw 2 title \"HF transformers\""; fi
  echo "set title \"$2\"; plot $p"
}
gnuplot <<GP
set terminal pngcairo size 1200,500 font ",11"
set output "$out"
set multiplot layout 1,2
set logscale x 2
set logscale y 10
set xlabel "tokens (context for decode, prompt length for prefill)"
set ylabel "tokens / s"
set grid
set key top right
$(plot_phase decode "decode (batch 1)")
$(plot_phase prefill "prefill")
unset multiplot
GP
echo "wrote $out"
