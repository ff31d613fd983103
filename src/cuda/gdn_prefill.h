// Gated DeltaNet core for a chunk of T token rows (prefill), MODEL.md 2.4 steps 3-9, in a few launches instead of
// one gdn_step launch per row: a parallel pre-pass (causal conv + SiLU with the carried conv state, l2-normalised
// q and k), the delta rule, and the gated RMSNorm over all rows. The delta rule has two forms: one sequential scan
// over all T rows with the state held in registers (gdn_prefill.cu), or the chunked WY form on the tensor cores
// (gdn_chunked.cu, chunks of 64 rows). Plain header (no fmt): shared by the .cu files, the backend, tests and
// benchmarks.
#pragma once
#include <cstdint>

#include "cuda/kernels.h"

namespace fern::cuda {

// Head shapes the multi-row kernels take: Dk in {16, 32, 64, 128}, Dv a multiple of 32 up to 256, conv kernel
// 2..8, Hv a multiple of Hk. The caller runs gdn_step row by row for any other shape.
bool gdn_prefill_ok(const GdnShape& sh);

// The form of the delta rule: the register-resident scan, or the chunked WY form (shapes gdn_chunked_ok takes).
enum class GdnForm { Scan, Chunked };

// Floats of device scratch gdn_prefill needs for T rows: the conv output [T, conv_dim], and for the chunked form
// its workspace after it (gdn_chunked_ws_floats).
int64_t gdn_prefill_scratch_floats(const GdnShape& sh, int T, GdnForm form = GdnForm::Scan);

// Rows 0..T-1 of mixed [T, conv_dim], z [T, Hv*Dv], b and a [T, Hv]: conv with conv_state [kernel-1, conv_dim]
// (F32, oldest first; updated to the chunk's last kernel-1 inputs), the delta rule on state [Hv, Dk, Dv] (F32,
// updated once at the end), gated RMSNorm with z -> y [T, Hv*Dv] (norm_w null: y holds the raw delta-rule outputs,
// for a caller that applies the gated norm itself, gemm_wg.h gated_norm_xbf_q4). xc: gdn_prefill_scratch_floats(sh, T, form)
// floats, 16-byte aligned. Uses no counters. Launches are asynchronous on c.stream.
void gdn_prefill(const Ctx& c, const GdnShape& sh, int T, const float* mixed, const float* z, const float* b,
                 const float* a, const float* conv_w, const float* A_log, const float* dt_bias, const float* norm_w,
                 float* conv_state, float* state, float* y, float* xc, GdnForm form = GdnForm::Scan);

// How the scan splits a value head's state over threads: P slices of the key dimension per state column (the
// slices' partial dot products are added with shuffles) and 1 or 2 columns per thread. Default: the measured best
// for the shape.
enum class GdnScan { Default, Slices4, Slices8, Slices8Cols2 };
bool gdn_scan_ok(const GdnShape& sh, GdnScan variant);  // Slices8*: Dk >= 32

// The three launches of gdn_prefill, one by one (for tests and benchmarks of the parts and scan variants).
void gdn_prefill_conv(const Ctx& c, const GdnShape& sh, int T, const float* mixed, const float* conv_w,
                      float* conv_state, float* xc);
void gdn_prefill_scan(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                      const float* A_log, const float* dt_bias, float* state, float* y,
                      GdnScan variant = GdnScan::Default);
void gdn_prefill_norm(const Ctx& c, const GdnShape& sh, int T, const float* z, const float* norm_w, float* y);

// ---- the chunked WY form (gdn_chunked.cu) ----
constexpr int kGdnChunk = 64;  // rows per chunk (MODEL.md 2.4); the last chunk is padded with zero rows
// gdn_prefill_ok and Dk in {32, 64, 128}.
bool gdn_chunked_ok(const GdnShape& sh);
// Floats of its workspace for T rows: per (chunk, value head) W [64, Dk], U [64, Dv], the masked decayed Q K^T
// [64, 64] and two decay vectors [64] (about 84 MB at the real shape and T = 2048).
int64_t gdn_chunked_ws_floats(const GdnShape& sh, int T);
// The delta rule in the chunked form over the pre-pass output xc (in place of gdn_prefill_scan): raw outputs into
// y [T, Hv*Dv], state [Hv, Dk, Dv] updated. ws: gdn_chunked_ws_floats floats, 16-byte aligned. Two launches:
// the parallel per-chunk part (gdn_chunked_prep) and the recurrence over the chunks (gdn_chunked_state).
void gdn_prefill_chunked(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                         const float* A_log, const float* dt_bias, float* state, float* y, float* ws);
void gdn_chunked_prep(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                      const float* A_log, const float* dt_bias, float* ws);
void gdn_chunked_state(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* ws, float* state,
                       float* y);

}  // namespace fern::cuda
