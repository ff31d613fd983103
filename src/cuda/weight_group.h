// One device region for the matrices that one multi-matrix GEMV reads together (a layer's mixer input projections:
// GDN qkv | z | b | a, attention q | k | v): all their codes back to back, then all their scales, then all their
// biases, so that matrix i's rows follow matrix i - 1's in each array. The decode GEMV then reads the table as one
// matrix and picks a matrix only for the output row (linear.cu, mats_contiguous); the other kernels still see
// separate weights (their views into the region).
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "model/weights.h"

namespace fern::cuda {

// Byte offsets of one matrix's codes, scales and biases from the region's start.
struct GroupPiece {
  size_t w = 0, s = 0, b = 0;
};

struct GroupLayout {
  std::vector<GroupPiece> at;  // empty: the matrices cannot share a region (different formats, stacks, dense)
  size_t bytes = 0;
};

// The region's layout for ws (affine plain matrices of one bits / in / group size; otherwise empty). Each array
// starts on a 256-byte boundary; inside it the matrices' parts follow each other with no gap unless a part's size
// is not a multiple of 16 bytes (then rounded up, and those rows are not consecutive: the GEMV sees it and reads
// the matrices separately).
GroupLayout group_layout(std::span<const LinearWeight* const> ws);

// The matrices' views into a region at `base` laid out by `layout` (shapes and formats from ws).
std::vector<LinearWeight> group_views(std::span<const LinearWeight* const> ws, const GroupLayout& layout, char* base);

}  // namespace fern::cuda
