# Sourced by the GPU-machine scripts (bench/run_gpu_all.sh, bench/compare/run_gpu_compare.sh, bench/cuda/run_gpu*.sh):
# the summary helpers, the exact commit to build, the environment and the CMake configure step, and the CUDA test
# loop. From the repository root. Functions:
#   gpu_unpack_head NAME   if .carry/NAME.tar exists, build from that archive of a commit in /tmp/w (the git
#                          directory on the GPU machine is a snapshot from the session start, docs/GPU.md; make it
#                          with `git archive -o .carry/NAME.tar HEAD; git rev-parse --short=12 HEAD >.carry/NAME.commit`)
#   gpu_configure          tools/gpu-env.sh, Node.js from .carry/node when carried, cmake into build/
#   gpu_build TARGETS...   ninja -k 0 (a target broken by someone else's commit does not stop the others)
#   gpu_cuda_test_targets  the names of all CUDA test executables
#   gpu_run_cuda_tests     every CUDA test, one after the other (their CPU references use all cores), into
#                          $OUT/cuda_tests.log; sets GPU_TEST_FAILS
#   gpu_test_names SPECS...  the executables of test specs (NAME or NAME:GTEST_FILTER), for gpu_build
#   gpu_run_test_specs SPECS...  those tests from build/, one after the other, into $OUT/tests.log (a line each)
#   gpu_run_node_suite [SECONDS]  the Node server suite (official openai client) against build/fern, whose default
#                          backend is CUDA where a GPU is present; into $OUT/node_suite.log (skipped without node)
#   gpu_build_tree NAME DIR JOBS FLAGS TARGETS...  the archive .carry/var/NAME.tar (and its NAME.commit) unpacked into
#                          DIR and TARGETS built there (CMAKE_CUDA_FLAGS=FLAGS, ninja -jJOBS), logs $OUT/cmake_NAME.log and
#                          $OUT/build_NAME.log; several run in parallel (&, wait) to compare commits side by side;
#                          GPU_TREE_OVERLAY: files (paths from the root) of the running tree copied over the archive's
#   gpu_decode_switch SWITCH LENGTHS [SECONDS [NAME]]  `fern bench` decode on the random full-size model at LENGTHS,
#                          3 runs, with --decode-switch SWITCH (NAME=v1,v2: the values interleaved run by run in one
#                          process), into $OUT/NAME.md (default decode; its table printed)
#   note TEXT / elapsed / gpu_summary
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
gpu_start=$(date +%s)
summary=""
GPU_COMMIT=unknown
note() { summary+="$1"$'\n'; echo "== $1"; }
elapsed() { echo "$(( $(date +%s) - gpu_start )) s"; }
gpu_summary() { echo "== SUMMARY"; printf "%s" "$summary"; }

gpu_unpack_head() {
  local name=$1
  [ -f ".carry/$name.tar" ] || return 0
  [ -f ".carry/$name.commit" ] && GPU_COMMIT=$(cat ".carry/$name.commit")
  rm -rf /tmp/w && mkdir -p /tmp/w && tar -C /tmp/w -xf ".carry/$name.tar" && cp -r .carry /tmp/w/ && cd /tmp/w || exit 1
}

gpu_configure() {
  source tools/gpu-env.sh
  if [ -f .carry/node/node.xz ] && ! command -v node >/dev/null; then
    mkdir -p /tmp/nodebin && xz -dc .carry/node/node.xz >/tmp/nodebin/node && chmod +x /tmp/nodebin/node
    export PATH=/tmp/nodebin:$PATH
    mkdir -p third_party/npm && tar -C third_party/npm -xJf .carry/node/npm-min.tar.xz
  fi
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $GPU_COMMIT node $(node --version 2>/dev/null || echo none)"
  local commit_def=()
  [ "$GPU_COMMIT" != unknown ] && commit_def=(-DFERN_GIT_COMMIT="$GPU_COMMIT")
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real "${commit_def[@]}" >"$OUT/cmake.log" 2>&1 ||
    { tail -30 "$OUT/cmake.log"; exit 1; }
}

gpu_cuda_test_targets() { ninja -C build -t targets all | grep -o '^cuda_test_[a-z_0-9]*' | sort -u | tr '\n' ' '; }

gpu_build() {
  ninja -C build -k 0 -j16 "$@" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; note "build: some targets FAILED"; }
  note "build: $(elapsed)"
}

gpu_run_cuda_tests() {
  GPU_TEST_FAILS=""
  local t
  for t in build/cuda_test_*; do
    [ -x "$t" ] || continue
    timeout "${TEST_TIMEOUT:-150}" "$t" >>"$OUT/cuda_tests.log" 2>&1 || GPU_TEST_FAILS+=" $(basename "$t")"
  done
  note "CUDA tests: $(grep -c '^\[       OK' "$OUT/cuda_tests.log") OK, failed:${GPU_TEST_FAILS:- none} ($(elapsed))"
  grep -B3 -A8 "Failure" "$OUT/cuda_tests.log" | head -40
}

gpu_test_names() { local t; for t in "$@"; do echo "${t%%:*}"; done; }

gpu_run_test_specs() {
  local t filter
  for t in "$@"; do
    filter='*'
    [ "$t" != "${t%%:*}" ] && filter=${t#*:}
    timeout 300 "build/${t%%:*}" --gtest_filter="$filter" >>"$OUT/tests.log" 2>&1
    note "$t rc $? ($(grep -c '^\[       OK' "$OUT/tests.log") OK so far, $(grep -c '^\[  FAILED' "$OUT/tests.log") FAILED lines)"
  done
}

gpu_run_node_suite() {
  command -v node >/dev/null || { note "Node server suite: skipped (no node; carry .carry/node)"; return 0; }
  FERN_BIN=$PWD/build/fern timeout "${1:-300}" node --test tests/server/*.test.mjs >"$OUT/node_suite.log" 2>&1
  note "Node server suite (rc $?): $(grep -E '^# (tests|pass|fail)' "$OUT/node_suite.log" | tr '\n' ' ') ($(elapsed))"
  grep -B2 -A12 "^not ok" "$OUT/node_suite.log" | head -40
}

gpu_decode_switch() {
  local name=${4:-decode}
  timeout "${3:-300}" build/fern bench --synth qwen3.6-35b-a3b --backend cuda --phase decode --lengths "$2" --runs 3 \
    --decode-switch "$1" >"$OUT/$name.md" 2>"$OUT/$name.err"
  note "decode switch $1 at $2 rc $? ($(elapsed))"
  grep -E "^\|" "$OUT/$name.md"
}

gpu_build_tree() {
  local name=$1 dir=$2 jobs=$3 flags=$4 root=$PWD
  shift 4
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xf ".carry/var/$name.tar" || return 1
  local f
  for f in ${GPU_TREE_OVERLAY:-}; do cp "$f" "$dir/$f" || return 1; done  # this tree's files over the archive's
  (cd "$dir" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERN_CUDA_ARCHS=90a-real \
    -DCMAKE_CUDA_FLAGS="$flags" -DFERN_GIT_COMMIT="$(cat "$root/.carry/var/$name.commit")" >"$OUT/cmake_$name.log" 2>&1 &&
    ninja -C build -k 0 -j"$jobs" "$@" >"$OUT/build_$name.log" 2>&1)
}
