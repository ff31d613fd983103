// The fp16 input of the fast tensor-core GEMMs (gemm_tile_f16.cuh): activations converted once per op, not once per
// tile and block. Row t of x is stored as fp16 x[t] * 2^-e_t with the power of two chosen so that the row's largest
// magnitude lands in [2^13, 2^14): no fp16 overflow is possible (fp16 max 65504), small rows keep all 11
// significant bits instead of sinking into fp16 subnormals, and the GEMM epilogue multiplies by scale[t] = 2^e_t
// (exact). Plain header (no fmt): shared by .cu and .cpp files.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/kernels.h"

namespace fern::cuda {

// Rows of fp16 activations in device memory: x [rows, K] (fp16 bits), scale [rows] (powers of two, F32).
struct X16 {
  uint16_t* x = nullptr;
  float* scale = nullptr;
};

// Bytes of workspace for `rows` rows of width K (the fp16 rows, then the scales, each 256-byte aligned).
size_t x16_bytes(int64_t rows, int64_t K);
// Lays an X16 of rows x K out in `ws` (at least x16_bytes(rows, K) bytes).
X16 x16_carve(void* ws, int64_t rows, int64_t K);
// out = the fp16 rows of x [rows, K] (F32). K a multiple of 4.
void to_x16(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out);

// Whether the fp16 path takes a weight format: 4- or 8-bit affine codes (bf16 weights stay on the split path).
inline bool gemm_f16_format_ok(const QW& w) { return w.bits == 4 || w.bits == 8; }

}  // namespace fern::cuda
