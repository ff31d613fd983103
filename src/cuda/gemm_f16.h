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
// Precise form (lo != nullptr): x holds hi = fp16(x') and lo = fp16(x' - hi) of the scaled row x' (together ~22
// significant bits), and sums [rows, ks] the fp32 sums of x' over each 16-wide segment (zero past K; ks =
// 4 ceil(K / 64), so that a 64-wide tile's four sums are one aligned 16-byte copy).
struct X16 {
  uint16_t* x = nullptr;
  float* scale = nullptr;
  uint16_t* lo = nullptr;
  float* sums = nullptr;
  int64_t ks = 0;
  // The bf16 hi/lo rows of the wgmma loops (gemm_wg.h) in the exact-code loop's layout: each 8-wide chunk in the K
  // order 0 4 1 5 2 6 3 7, and sums [rows, ks = K / 64] the 64-wide sums of hi + lo (to_xbf_q4); with lo == nullptr
  // (q4h) x holds one fp16 row per row instead, and the sums are those of its values.
  bool q4 = false;
  // q4b (FERN_GEMM_WG_PIPE=q4b, xbf_carve(..., bias_mma)): the 64-wide sums also as bf16 hi/lo pieces, bsum [rows,
  // bk], in blocks of 16 groups: [hi of groups 16 t .. 16 t + 15 | lo of the same groups] for t = 0, 1, ..., zeros
  // past the last group and up to bk (q4b_sum_width: at least 64).
  uint16_t* bsum = nullptr;
  int64_t bk = 0;
  // The exact-code loop's fp16 rows (FERN_GEMM_WG_PIPE=q4h, xbf_carve(..., half)).
  bool q4h() const { return q4 && lo == nullptr; }
  // The exact-code loop with the bias term on the tensor cores (FERN_GEMM_WG_PIPE=q4b).
  bool q4b() const { return q4 && bsum != nullptr; }
};

// Bytes of workspace for `rows` rows of width K (the arrays, each 256-byte aligned).
size_t x16_bytes(int64_t rows, int64_t K, bool precise = false);
// Lays an X16 of rows x K out in `ws` (at least x16_bytes(rows, K, precise) bytes).
X16 x16_carve(void* ws, int64_t rows, int64_t K, bool precise = false);
// out = the fp16 rows of x [rows, K] (F32), with lo and sums when out.lo is set (K a multiple of 16), else K a
// multiple of 4.
void to_x16(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out);

// The tile loops of the prefill GEMMs, chosen by FERN_GEMM (read on every call):
//   split   the bf16 hi/lo loop of gemm_tile.cuh (x converted per tile and block, two bf16 MMAs per fragment);
//   fp16    gemm_tile_f16.cuh on fp16 rows and weights dequantized to fp16: one MMA per fragment, NMSE ~1e-7;
//   fp16x2  gemm_tile_f16.cuh on precise fp16 rows (hi and lo: two MMAs per fragment) and exact codes, the scale and
//           bias applied per group to fp32 partial sums: the split loop's numerics in the pipelined loop;
//   wg      gemm_tile_wg.cuh (sm_90a): warpgroup MMAs on bf16 hi + lo splits of x and of the weights dequantized once
//           per block, three MMAs per step: the split loop's precision (gemm_wg.h).
// Unset: wg where the device and the build run it (gemm_wg_supported), else split. An unknown value, or wg where it
// cannot run, is a user error naming the value.
enum class GemmMode { Split, Fp16, Fp16x2, Wg };
GemmMode gemm_mode();

// Whether the fp16 path takes a weight format: 4- or 8-bit affine codes (bf16 weights stay on the split path).
inline bool gemm_f16_format_ok(const QW& w) { return w.bits == 4 || w.bits == 8; }

}  // namespace fern::cuda
