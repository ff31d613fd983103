// Byte ranges that the kernel after a launch will read (a decode step's next weights), handed to the launch so that
// it requests them into L2 while its own loads are done and the memory would sit idle (cuda_util.cuh
// l2_prefetch_share). The fused MoE of layer l takes layer l + 1's input projections (docs/notes/cuda-decode-v30-int-digits.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace fern::cuda {

constexpr int kL2PrefetchRanges = 4;

struct L2Prefetch {
  const char* p[kL2PrefetchRanges] = {};   // 16-byte aligned
  uint32_t bytes[kL2PrefetchRanges] = {};  // multiples of 16
  int n = 0;                               // ranges in use
  int mode = 0;                            // 0 none, 1 bulk (cp.async.bulk.prefetch.L2, sm_90+), 2 per 128-byte line
};

// A piece of device memory (a weight's codes, scales or biases).
struct L2Piece {
  const char* p = nullptr;
  size_t bytes = 0;
};
// Pieces closer than this are one range (the gap is prefetched too: fewer, larger requests).
constexpr size_t kL2PrefetchGap = 4096;
// At most this much in all (about half the H200's 50 MB L2: the hint must not evict what the kernels between
// the request and its use read).
constexpr size_t kL2PrefetchMaxBytes = size_t(24) << 20;

// The ranges for `pieces` (sorted by address, merged, trimmed to whole 16-byte units inside each piece, at most
// kL2PrefetchRanges of them and kL2PrefetchMaxBytes in all, in address order); mode as L2Prefetch::mode (0: none).
L2Prefetch l2_prefetch_ranges(std::span<const L2Piece> pieces, int mode);

}  // namespace fern::cuda
