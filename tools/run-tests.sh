#!/usr/bin/env bash
# Runs the whole test suite: the release build's ctest (unit, model, tokenizer, engine and server tests; GPU tests
# skip themselves without a GPU), then the parser tests again under AddressSanitizer + UBSan, then the fuzzers for
# a bounded time. Expects tools/install-deps.sh to have run. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

# Sanitizer build: only what the parser tests need (no CUDA), then the tests labelled "parser".
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERN_SANITIZE=ON -DFERN_CUDA=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L parser

# libFuzzer targets (clang), each for a bounded time.
if [ -x tools/run-fuzzers.sh ]; then
  FUZZ_SECONDS=$FUZZ_SECONDS tools/run-fuzzers.sh
fi
