#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in build-fuzz and runs each for
# FUZZ_SECONDS (default 30), starting from the seeds in tests/fuzz/corpus/<target> (new inputs go to a scratch
# copy, so the committed seeds stay as they are). Exits non-zero when a target crashes; the crashing input is kept
# in build-fuzz/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
JOBS=${JOBS:-$(nproc)}
TARGETS=(fuzz_tokenizer fuzz_tokenizer_json fuzz_tool_parser fuzz_chat_format fuzz_json_schema)

CC=${FUZZ_CC:-clang} CXX=${FUZZ_CXX:-clang++} cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERN_FUZZ=ON -DFERN_TESTS=OFF -DFERN_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$JOBS" --target "${TARGETS[@]}"

mkdir -p build-fuzz/crashes
status=0
for t in "${TARGETS[@]}"; do
  work="build-fuzz/corpus/${t#fuzz_}"
  mkdir -p "$work"
  if [ -d "tests/fuzz/corpus/${t#fuzz_}" ]; then cp -n tests/fuzz/corpus/"${t#fuzz_}"/* "$work"/ 2>/dev/null || true; fi
  echo "== $t for ${FUZZ_SECONDS}s"
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "build-fuzz/$t" "$work" \
      -max_total_time="$FUZZ_SECONDS" -max_len=4096 -rss_limit_mb=4096 -timeout=20 \
      -artifact_prefix="build-fuzz/crashes/$t-" -print_final_stats=1 2>"build-fuzz/$t.log"; then
    echo "FAILED: $t (see build-fuzz/$t.log and build-fuzz/crashes/)"
    tail -40 "build-fuzz/$t.log"
    status=1
  else
    grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" "build-fuzz/$t.log" | tail -2 || true
  fi
done
exit $status
