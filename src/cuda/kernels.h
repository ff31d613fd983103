// Host-side entry points of the CUDA kernels (plain C++ so that the backend and the tests can call them). Every
// launch is asynchronous on the given stream; nothing here synchronises with the host. Activations are F32, the
// KV cache BF16, the recurrent and conv states F32. Values that change from one decode step to the next (the
// position) are read from device memory (`d_pos`), never passed by value, so that a captured step can be replayed.
// This header must not include fmt (nvcc cannot compile fmt 9 in C++20 mode): it is shared by .cu and .cpp files.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>


namespace fern::cuda {

// A LinearWeight on the device, by value for kernels. Affine: w holds U32 words, 32/bits values per word from the
// least significant bits up, s/b hold BF16 scales/biases per group. Dense: w holds BF16 [out, in].
struct QW {
  const void* w = nullptr;
  const uint16_t* s = nullptr;
  const uint16_t* b = nullptr;
  int64_t out = 0, in = 0;
  int64_t w_expert = 0;   // elements of w (words or bf16) from one expert to the next
  int64_t sb_expert = 0;  // elements of s/b from one expert to the next
  int bits = 16;          // 4 or 8 (affine), 16 (dense bf16)
  int gs = 0;             // group size (affine)
  int experts = 0;
};

// Launch context: the stream and the number of multiprocessors (to size persistent grids).
struct Ctx {
  cudaStream_t stream = nullptr;
  int sms = 132;
  int* counters = nullptr;  // zeroed device ints for "last block" reductions; each user owns a disjoint slice
  int n_counters = 0;       // ints in that slice (users that need one per token row fall back when T exceeds it)
  bool pdl = false;         // launch with programmatic dependent launch (sm_90+)
  // Prefill GEMMs (linear_gemm): device workspace for the input converted to fp16 rows (gemm_f16.h, x16_bytes);
  // without it, or too small, they take the precise split path (gemm_tile.cuh).
  void* gemm_ws = nullptr;
  size_t gemm_ws_bytes = 0;
  bool gemm_precise = false;  // with gemm_ws: the precise fp16 form (gemm_f16.h: hi and lo rows, exact codes)
  bool gemm_wg = false;       // with gemm_ws: the wgmma loop on bf16 hi and lo rows (gemm_wg.h)
};

// y[t] = x[t] W^T for t < T. x [T, in], y [T, out] (F32).
void linear(const Ctx& c, const QW& w, const float* x, float* y, int T);
// ys[i][t] = x[t] W_i^T for n <= 4 matrices of one input, in one launch over their concatenated rows. They must
// share bits, width and group size (linear_multi_ok).
bool linear_multi_ok(const QW* ws, int n);
// Whether such a table's matrices follow each other in memory (weight_group.h), so that the decode GEMV reads it as
// one matrix (FERN_CUDA_GEMV_CONTIG).
bool linear_multi_contiguous(const QW* ws, int n);
void linear_multi(const Ctx& c, const QW* ws, const float* x, float* const* ys, int n, int T);
// linear_multi of xn = rmsnorm(x) * norm_w, the norm computed by every block while staging its input (always the
// GEMV: decode; width <= 4096). xn (may be null) receives the normed rows.
void linear_multi_norm(const Ctx& c, const QW* ws, const float* x, const float* norm_w, float eps, float* xn,
                       float* const* ys, int n, int T);
// One matrix with the input norm inside the GEMV (T = 1): y = (rmsnorm(x) * norm_w) W^T, xn = the normed row.
void linear_norm(const Ctx& c, const QW& w, const float* x, const float* norm_w, float eps, float* xn, float* y);
// The next MoE's router run by a mixer's output projection (FERN_CUDA_MOE_FOLD, docs/notes/cuda-decode-v31-fold.md):
// the router's logits are linear in the normed row, l = inv * R (norm_w * r) with r = resid + y and inv the norm's
// positive factor, so the projection, which makes y row by row, also adds y to resid and accumulates
// pre[e] = sum_n R[e][n] norm_w[n] r[n] over its rows (e < E: the router's rows, e = E: the shared-expert gate's row),
// and the MoE (moe_fused with MoeNorm::pre) starts at the top-k instead of at the router's rows and a grid-wide
// handoff: the top-k order does not depend on inv, the routing weights take it from the MoE's own norm. The partial
// sums are added in fixed point (units of 2^-kFoldShift, 64-bit integer atomics), so the result has the same bits
// whatever order the blocks finish in. pre must be zero before the projection; the MoE zeroes it again.
constexpr int kFoldShift = 32;
constexpr float kFoldUnit = 4294967296.0f;  // 2^kFoldShift
// Pre-logit e lives at pre[e * stride]: by default a 256-byte line of its own, so that the projection blocks'
// atomics (E + 1 per block) spread over the L2's slices instead of queueing at the few that hold a packed array.
constexpr int kFoldStride = 32;
struct RouteFold {
  QW router, sgr;                  // [E, H] and [1, H], 8-bit in groups of 64 (H = the projection's rows)
  const void* packed = nullptr;    // the two repacked by route_fold_pack
  const float* norm_w = nullptr;   // [H] the MoE's input norm weight
  float* resid = nullptr;          // [H] the residual stream: resid += y
  long long* pre = nullptr;        // [(E + 1) * stride] fixed-point pre-logits, e at e * stride
  int stride = kFoldStride;
};
// The router and shared-expert gate repacked for the fold's loads (route_fold_pack_bytes(router) bytes at dst,
// 16-byte aligned): for each 16 columns c, the 16 code bytes of rows 0 .. E (E: the shared-expert gate) one after
// another, then for each group of 64 columns the rows' scale and bias as one word (bf16 scale low, bias high). A
// projection block reads its 16 columns of all E + 1 rows in whole lines; from the rows' own layout each 16 bytes and
// each scale was a request of its own (~100K per launch, which slowed the kernel before the projection too).
// Whether route_fold_pack takes these (an 8-bit router in groups of 64 and a one-row gate of its width, rows on
// 16-byte boundaries); route_fold_ok requires it of RouteFold's router and sgr.
bool route_fold_pack_ok(const QW& router, const QW& sgr);
size_t route_fold_pack_bytes(const QW& router);
void route_fold_pack(const Ctx& c, const QW& router, const QW& sgr, void* dst);
// Whether the output projection w (one token row) can take the fold: 4-bit in groups of 64, width 2,048 .. 4,096 (a
// multiple of 2,048), rows a multiple of 16, and the router's shape and format as above.
bool route_fold_ok(const QW& w, const RouteFold& f);
// y = x W^T for one token row with the fold (route_fold_ok must hold).
void linear_fold(const Ctx& c, const QW& w, const float* x, float* y, const RouteFold& f);
// out = g W^T for one token row, where g is the GDN core's gated RMSNorm (MODEL.md 2.4 step 9) of its raw output
// y [n]: per head of `head` values g = y * rsqrt(mean(y^2) + eps) * norm_w * silu(z), norm_w [head] shared by all
// heads. Every block of the GEMV computes g while staging its input (no launch, no round trip for the norm).
// early_z: the caller guarantees that z was written at least two launches before this one (the GDN core launch
// sits between), so it is read before the PDL wait (gdn.cu's rule for the state). Needs linear_gated_norm_ok.
bool linear_gated_norm_ok(const QW& w, int head);
void linear_gated_norm(const Ctx& c, const QW& w, const float* y, const float* z, const float* norm_w, float eps,
                       int head, float* out, bool early_z = false, const RouteFold* fold = nullptr);
// Prefill: token rows from which linear/linear_multi may use the tensor-core kernel below instead of the GEMV
// (they do when linear_gemm_wins: a supported shape and a grid large enough to fill the GPU).
constexpr int kGemmMinRows = 16;
// The tensor-core kernel (linear_gemm.cu): weight tiles read once per 64 token rows. Needs a width that is a
// multiple of 64 and, for affine weights, a group size that is a multiple of 16 (linear_gemm_ok).
bool linear_gemm_ok(const QW& w);
bool linear_gemm_wins(const QW& w, int T);
void linear_gemm(const Ctx& c, const QW& w, const float* x, float* y, int T);
// ys[i] = x W_i^T for n <= 4 matrices of one width and format (linear_multi_ok) in one launch of the wgmma loop, x
// converted once: when the context has that loop and its workspace (c.gemm_wg, c.gemm_ws for x), T >= kGemmMinRows
// and every matrix suits it. Returns false (and launches nothing) otherwise.
bool linear_gemm_multi(const Ctx& c, const QW* ws, const float* x, float* const* ys, int n, int T);
// The same after the rows' RMSNorm (weight norm_w), computed straight into the exact-code loop's rows
// (rmsnorm_xbf_q4: the fp32 normed rows are never written). Only where that loop takes the matrices (the
// FERN_GEMM_WG_PIPE forms q4, q4b, q4h); false (nothing launched) otherwise.
bool linear_gemm_multi_norm(const Ctx& c, const QW* ws, const float* x, const float* norm_w, float eps,
                            float* const* ys, int n, int T);
// y = out_proj of the GDN core's raw outputs y after their gated norm (Hv heads of width Dv per row, norm weight
// norm_w, gate z), the norm computed straight into the exact-code loop's rows (gated_norm_xbf_q4: y is left as it
// was). Where that loop takes w as linear_gemm_multi would; false (nothing launched) otherwise.
bool linear_gemm_gated_norm(const Ctx& c, const QW& w, const float* y, const float* z, const float* norm_w, float eps,
                            int Hv, int Dv, float* out, int T);
// The GEMV for any T (every row re-reads the weights; linear() uses it unless linear_gemm_wins). For benchmarks.
void linear_gemv(const Ctx& c, const QW& w, const float* x, float* y, int T);

// out[t] = dequant(table)[ids[t]] (ids clamped into range).
void embed(const Ctx& c, const QW& table, const int32_t* ids, float* out, int T);
// out = x * rsqrt(mean(x^2) + eps) * w, rows of D.
void rmsnorm(const Ctx& c, float* out, const float* x, const float* w, int rows, int D, float eps);
// resid += delta; out = rmsnorm(resid).
void add_rmsnorm(const Ctx& c, float* resid, const float* delta, float* out, const float* w, int rows, int D,
                 float eps);
void add(const Ctx& c, float* out, const float* a, const float* b, int64_t n);
// ids[t] = argmax_j logits[t, j], lowest index on ties, NaN never chosen. Uses counters[0, T) and
// argmax_scratch_bytes(T) bytes of device scratch.
size_t argmax_scratch_bytes(int T);
void argmax(const Ctx& c, int32_t* ids, const float* logits, int T, int64_t V, void* scratch);

// ---- MoE (MODEL.md 2.5) ----
struct MoeScratch {
  float* router_logits;  // [T, E]
  float* sgate_logit;    // [T]
  int32_t* topk_ids;     // [T, k]
  float* topk_w;         // [T, k]
  float* sgate;          // [T]  sigmoid(shared gate logit)
  float* h;              // [T, k*I + Is]  SiLU(gate)*up per routed slot, then the shared expert's
};
// Router and shared-expert-gate logits, then softmax/top-k/renormalisation and sigmoid of the shared gate. One
// launch (the fused router GEMV, whose last block per token runs the top-k; uses counters[0, T)) when the shared
// gate is one row of the router's format and T <= n_counters; otherwise three.
void moe_route(const Ctx& c, const QW& router, const QW& shared_gate, const float* x, const MoeScratch& s, int T,
               int topk);
// The fused router GEMV alone; returns false (launching nothing) when the shapes or counters do not allow it.
bool route_fused(const Ctx& c, const QW& router, const QW& shared_gate, const float* x, float* logits,
                 float* sg_logit, int32_t* ids, float* wts, float* sgate, int T, int topk);
void moe_gate_up(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const float* x,
                 const MoeScratch& s, int T, int topk);
void moe_down(const Ctx& c, const QW& down, const QW& sdown, const MoeScratch& s, float* out, int T, int topk);

// The whole block of one token row in one launch (moe_fused.cu: router, top-k, gate/up, down with two grid-wide
// handoffs; with MoeNorm::pre the router ran in the projection before, and one handoff is left). Uses counters[0, kMoeFusedCounters), zero before the first launch and left consistent by every launch.
// Returns false (launching nothing) for formats or shapes it does not take: it needs 4-bit experts, a router and
// shared-expert gate of 8 or 4 bits, top-k <= 32, and staging within 96 KB of shared memory.
struct MoeQW {
  QW router, sgr;        // router [E, H], shared-expert gate [1, H]
  QW gate, up, down;     // routed experts
  QW sgate, sup, sdown;  // shared expert
};
constexpr int kMoeFusedCounters = 5;
// With `norm`, the input is computed by the kernel: resid += delta; x = rmsnorm(resid) * w (written to xn when
// non-null); `x` is then unused and `out` may alias delta; with add_out, also resid += out at the end. Needs
// H <= 2048.
struct MoeNorm {
  float* resid = nullptr;
  const float* delta = nullptr;
  const float* w = nullptr;
  float eps = 0.0f;
  float* xn = nullptr;
  bool add_out = false;
  // The router run by the output projection before (RouteFold): resid already holds resid + delta (delta unused),
  // pre the fixed-point pre-logits (RouteFold::pre), zeroed by this launch once read. Needs moe_fused_fold_ok.
  long long* pre = nullptr;
  int pre_stride = kFoldStride;
};
// Whether moe_fused takes MoeNorm::pre for these weights under the current switches (the lean digit form with packed
// rows, 8-bit router, E <= 256).
bool moe_fused_fold_ok(const Ctx& c, const MoeQW& w, int topk);
bool moe_fused(const Ctx& c, const MoeQW& w, const float* x, const MoeScratch& s, float* out, int topk,
               const MoeNorm* norm = nullptr);
// Which packed scale/bias loads moe_fused would take for these weights under the current FERN_CUDA_MOE_SB: 0 none,
// 1 the gate/up rows, 2 the down rows too; -1 where it does not take the shapes (for tests).
int moe_fused_packing(const Ctx& c, const MoeQW& w, int topk);

// Phase timing of moe_fused (docs/notes/cuda-decode-v5.md): the same launch with %globaltimer stamps (ns) written
// to stamps[kMoeStamps] (zero before the launch): block 0's thread 0 at each point, and the latest (or, stored
// inverted, the earliest) block at a few. Compiled only with -DFERN_MOE_PHASE_TIMING (a separate instantiation;
// moe_fused itself is unchanged); otherwise it returns false and launches nothing.
enum MoeStamp {
  kMoeStampStart, kMoeStampWaited, kMoeStampStaged, kMoeStampArrive1, kMoeStampPass1, kMoeStampRouted,
  kMoeStampArrive2, kMoeStampPass2, kMoeStampHStaged, kMoeStampEnd,
  kMoeStampFirstStart, kMoeStampLastStart, kMoeStampLastArrive1, kMoeStampLastArrive2, kMoeStampLastEnd,
  kMoeStampTopkKeys, kMoeStampTopkRounds, kMoeStamps
};
bool moe_fused_timed(const Ctx& c, const MoeQW& w, const float* x, const MoeScratch& s, float* out, int topk,
                     const MoeNorm* norm, unsigned long long* stamps);

// ---- Gated DeltaNet (MODEL.md 2.4), one token row t of a call ----
struct GdnShape {
  int Hk, Hv, Dk, Dv, conv_dim, kernel;
  float eps;
};
// Head shapes the one-token kernel takes: Dk a multiple of 8 up to 128, Dv a multiple of 32 up to 256, conv
// kernel 2..8, Hv a multiple of Hk.
bool gdn_step_ok(const GdnShape& sh);
// Processes row t (MODEL.md 2.4 steps 3-8): conv over mixed[t] with conv_state [kernel-1, conv_dim] (F32, oldest
// first; updated), gates, l2 norms, the delta rule on state [Hv, Dk, Dv] (F32, updated) -> y[t], the raw
// delta-rule output before the gated norm (step 9: gdn_gated_norm, or the consumer: linear_gated_norm).
// Uses counters[0, Hk). early_state: the caller guarantees that the kernel launched just before this one does not
// write `state` (then, for t = 0, the state loads are issued before the PDL wait; gdn.cu says why that is safe).
void gdn_step_raw(const Ctx& c, const GdnShape& sh, int t, const float* mixed, const float* b, const float* a,
                  const float* conv_w, const float* A_log, const float* dt_bias, float* conv_state, float* state,
                  float* y, bool early_state = false);
// Step 9 in place on T rows of y [T, Hv*Dv]: per value head y = rmsnorm(y) * norm_w * silu(z) (eps = sh.eps).
void gdn_gated_norm(const Ctx& c, const GdnShape& sh, int T, const float* z, const float* norm_w, float* y);
// Steps 3-9 of row t: gdn_step_raw, then gdn_gated_norm of that row (two launches).
void gdn_step(const Ctx& c, const GdnShape& sh, int t, const float* mixed, const float* z, const float* b,
              const float* a, const float* conv_w, const float* A_log, const float* dt_bias, const float* norm_w,
              float* conv_state, float* state, float* y, bool early_state = false);

// ---- Gated attention (MODEL.md 2.3) ----
struct AttnShape {
  int Hq, Hkv, D, rot;  // rot = rotary dims
  float theta, eps;
  int64_t capacity;     // KV rows
};
// q/k RMSNorm + partial RoPE at position d_pos[0] + t, k and v appended to the BF16 caches, normed/roped queries
// written to q_out [T, Hq, D]. All T rows in one launch.
void attn_prep(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* qg, const float* k,
               const float* v, const float* q_norm, const float* k_norm, float* q_out, uint16_t* k_cache,
               uint16_t* v_cache, int T);
// Causal GQA attention of T query rows over the cache (row t sees positions [0, d_pos[0] + t]), split over the
// KV length into nsplit pieces, then combined and gated with sigmoid(gate) -> o [T, Hq*D].
// part_ml [T, Hq, nsplit, 2], part_acc [T, Hq, nsplit, D] are scratch.
void attn_decode(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                 const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o,
                 int T, int nsplit);
// Splits chosen for a state of this capacity (fixed per state so that a captured step keeps its grid).
int attn_splits(int64_t capacity);

// d_pos[0] += n (on the stream, so that a captured step advances the position on every replay).
void advance_pos(const Ctx& c, int32_t* d_pos, int n);

}  // namespace fern::cuda
