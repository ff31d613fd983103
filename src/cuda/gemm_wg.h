// The Hopper path of the prefill GEMMs (FERN_GEMM=wg, the default where it runs): warpgroup MMAs on bf16 hi + lo
// splits of both the activations and the once-per-block dequantized weights (gemm_tile_wg.cuh says why that is as
// precise as the split loop). The activations are split once per op into two bf16 row arrays (this header); the
// kernels need an sm_90a build running on a compute-capability 9.0 device (gemm_wg_supported). Plain header (no
// fmt): shared by .cu and .cpp files.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/gemm_f16.h"
#include "cuda/kernels.h"

namespace fern::cuda {

// Whether the current device runs the wgmma kernels (compute capability 9.0 and code compiled for sm_90a). Probed
// once per device.
bool gemm_wg_supported();

// Pipeline stages of the wgmma loop's 64-token and smaller tiles: FERN_GEMM_WG_STAGES=2 or 4 forces two (half the
// shared memory: two blocks per SM) or the deep default (4, or 3 below 64-token tiles); unset (0 here) lets each
// caller choose by its measured rule (linear_gemm_wg.cu, moe_prefill_wg.cu). Read on every call.
int gemm_wg_stages();

// The form of the wgmma loop, FERN_GEMM_WG_PIPE (read on every call):
//   q4b   (default) the exact-code loop (gemm_tile_q4.cuh) where the weights allow it (gemm_q4_ok: 4-bit codes,
//         groups a multiple of 64), else the synchronous loop: the codes enter as q (one bf16x2 subtraction per
//         register), each tile promotes acc += s P (one FMA), and after an item's K tiles one more ring tile
//         multiplies the rows' biases (exact in bf16) by the token rows' 64-wide sums as bf16 hi/lo pieces
//         (X16::bsum) into the accumulators; rows wider than 4096 (the bias tile's reach, wider than any of the
//         model's) take the q4 form. +3.0% / +2.2% prefill at 4K / 32K over q4 on the H200, the same NMSE on the
//         whole-model check (docs/notes/cuda-prefill-v21-turns.md sections 5-6); setmaxnreg: v22-setmaxnreg.md;
//   q4    the same loop with the bias term promoted per tile by FMAs on the fp32 sums (acc += s P + c xs; the
//         default until the twentieth session);
//   q4h   the exact-code loop on one fp16 row of x (relative rounding 2^-11) instead of the bf16 hi + lo pair: one
//         MMA per step instead of two, half the activation bytes; opt-in: +11% / +14% prefill at 4K / 32K on the
//         H200 (over q4), but fp16 activations move the small synthetic model's greedy tokens past issue 5's bound
//         (docs/notes/cuda-prefill-v13-q4h.md);
//   ws    the warp-specialized hi/lo loop (gemm_tile_ws.cuh: producer warpgroups fill a ring, the MMA warpgroups
//         never meet at a block barrier);
//   sync  the synchronous hi/lo loop (gemm_tile_wg.cuh); FERN_GEMM_WG_STAGES applies to it only.
// ws and sync compute the same products in the same order (bit-identical results).
enum class WgPipe { Q4, Q4h, Q4b, Ws, Sync };
WgPipe gemm_wg_pipe();
// Whether the form is one of the exact-code loop's (q4, q4h, q4b).
inline bool gemm_pipe_q4(WgPipe p) { return p == WgPipe::Q4 || p == WgPipe::Q4h || p == WgPipe::Q4b; }
// Whether the exact-code loop takes these weights (format only).
bool gemm_q4_ok(const QW& w);

// Output blocks one block of the exact-code loop computes in turn (q4tile::mainloop_items: one ring through all of
// them, so the block's start-up and drain are paid once; docs/notes/cuda-prefill-v8-items.md): `env` (read on every
// call, for comparisons: 1..64) if set, else the largest power of two up to `most` that still leaves `blocks` (the
// grid at one output block per block) at least three waves of one block per SM.
int items_per_block(const char* env, int64_t blocks, int most, int sms);

// x [rows, K] (F32) as bf16 hi rows (X16::x) and lo rows (X16::lo); scale and sums stay unset. K a multiple of 4.
// xbf_bytes leaves room for the exact-code loop's sums as well; xbf_carve(..., q4 = true) lays them out (K a multiple
// of 64) and marks the rows for that loop, which to_xbf_q4 then fills (hi/lo in its K order, and the 64-wide sums);
// with half (q4h) it carves one fp16 row per row of x and no lo rows (X16::lo == nullptr), which to_xbf_q4 fills
// with x rounded to fp16 (saturating) and the sums of those rounded values.
// With bias_mma (q4b) and K <= 4096 it also carves the sums' bf16 pieces (X16::bsum, q4b_sum_width(K) per row),
// which to_xbf_q4 fills as well (wider rows: the q4 form). xbf_bytes leaves room for them in every case.
size_t xbf_bytes(int64_t rows, int64_t K);
X16 xbf_carve(void* ws, int64_t rows, int64_t K, bool q4 = false, bool half = false, bool bias_mma = false);
// Width of a row of X16::bsum for rows of width K: 32 per 16 groups of 64 (hi and lo), rounded up to whole 64-wide
// (128-byte) rows, the unit the bias tile copies.
inline int64_t q4b_sum_width(int64_t K) {
  const int64_t w = 32 * ((K / 64 + 15) / 16);
  return (w + 63) / 64 * 64;
}
void to_xbf(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out);
void to_xbf_q4(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out);
// rmsnorm, then to_xbf_q4, in one launch with the same bits (one block per row; docs/notes/cuda-prefill-v31-norm-rows.md):
// out = the exact-code rows of rmsnorm(x) with weight w, or, with x == nullptr, of rmsnorm(resid + delta) after
// writing resid += delta (as add_rmsnorm). xn (may be null) receives the fp32 normed rows too. rmsnorm_xbf_q4_ok: K
// a multiple of 64, at most 4,096 (the norm's register row); the pointers 16-byte aligned. plain (may be null):
// rows carved without q4 that receive to_xbf's bf16 hi/lo of the normed rows as well (another GEMM's input).
bool rmsnorm_xbf_q4_ok(int64_t K);
void rmsnorm_xbf_q4(const Ctx& c, const float* x, float* resid, const float* delta, const float* w, float eps,
                    float* xn, int64_t rows, int64_t K, const X16& out, const X16* plain = nullptr);
// The GDN core's gated norm (gdn_gated_norm: y = rmsnorm(y) norm_w silu(z) per value head of width Dv, Hv heads per
// row), then to_xbf_q4 of the normed rows, in one launch with the same bits; y is left as it was.
// gated_norm_xbf_q4_ok: Dv a multiple of 64, at most 256.
bool gated_norm_xbf_q4_ok(int Hv, int Dv);
void gated_norm_xbf_q4(const Ctx& c, const float* y, const float* z, const float* w, float eps, int Hv, int Dv,
                       int64_t rows, const X16& out);
// Whether linear() of T rows of w, with the GEMM workspace of a context on the wgmma loop, converts x to to_xbf's
// plain rows and runs linear_gemm_wg_multi on them (so that rows converted elsewhere can be handed over instead).
bool linear_gemm_takes_plain_rows(const QW& w, int T);

// Dense ys[i] [T, ws[i].out] = x W_i^T on the wgmma loop from the split rows of x (to_xbf, or to_xbf_q4 for the
// exact-code loop: the loop follows x.q4), for 1 <= n <= 4 matrices of one width and format in one launch.
// linear_gemm_wg_ok: 4/8-bit affine weights, K a multiple of 64, groups a multiple of 16.
bool linear_gemm_wg_ok(const QW& w);
void linear_gemm_wg_multi(const Ctx& c, const QW* ws, float* const* ys, int n, const X16& x, int T);

}  // namespace fern::cuda
