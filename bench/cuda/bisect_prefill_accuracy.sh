#!/usr/bin/env bash
# Which multi-row (prefill) path moves the whole-model result? Runs the `small` peaked-logits check
# (CudaForward.SmallSynthCheckpointPeakedLogits) and the chunked-prefill test with each prefill block switched back
# to its previous path in turn. Needs a build with the CUDA tests (see docs/GPU.md); from the repository root:
#   bash bench/cuda/bisect_prefill_accuracy.sh build
# Context: that check gave prefill NMSE 1.0e-7 / top-1 1.000 at commit fbf2003 and 6.5e-5 / 0.9896 from 08af9e8 on
# (docs/notes/cuda-prefill-v2-gdn.md); between them only the GDN scan v2 (01be403) changed a T = 192 path.
set -u
B=${1:-build}
run() {  # label, env...
  local label=$1; shift
  local line
  line=$(env "$@" timeout 120 "$B/cuda_test_cuda_forward" --gtest_filter='*SmallSynth*' 2>&1 | grep -E "^synth small")
  printf '%-28s %s\n' "$label" "$line"
}
run default FERN_NONE=1
run gdn-rows FERN_GDN_PREFILL=rows
run attn-decode-kernel FERN_ATTN_PREFILL=decode
run moe-rows FERN_MOE_PATH=rows
run moe-router-gemv FERN_MOE_ROUTER=fused
run pdl-off FERN_CUDA_PDL=0
