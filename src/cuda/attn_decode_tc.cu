// Decode attention on the tensor cores (attn_decode_tc.h), flash-decoding style.
//
// A block (8 warps) owns one KV head, one query row and one split of the KV length in whole tiles of 64 keys. The
// tiles stream into shared memory with 16-byte cp.async, three stages deep (two tiles in flight while one is
// computed: 128 KB per SM at head_dim 256, ~4 us of HBM latency at the per-SM share of the bandwidth). Per tile:
//  - S = q K^T with mma.sync m16n8k16 (bf16 operands, fp32 accumulation): the 16 A rows are the G query heads as
//    bf16 "hi" parts (rows 0..7) and their remainders q - hi as bf16 "lo" parts (rows 8..15), so the padding rows
//    that m16 forces on 8 heads carry the rest of q's precision for free: a head's score is row g + row g + 8
//    (~16 significant bits of q against fp16's 11; the cache rows are bf16 and exact as operands). Each warp
//    computes one 8-key n-tile over the whole head dim.
//  - the tile's maximum per head over the 8 warps (shared memory, one barrier), the online-softmax update in the
//    exp2 domain (the scale and log2(e) are folded into q), and P split the same way: hi in rows 0..7, lo in
//    rows 8..15 of the A operand, so P V keeps ~16 bits of each weight. A warp's 8 keys are exactly half of one
//    16-key A fragment, stored as such in shared memory (second barrier).
//  - O += P V: each warp owns head_dim / 8 output dims over all 64 keys (V through ldmatrix.trans).
// The split's (max, sum, unnormalised output) go to the split kernel's combine (attn.cu), which also gates.
//
// With PREP (attn_decode_tc_prep, one query row) the kernel also does attn_prep's work, one launch less per
// attention layer (3.2 us of a 4K step's chain per layer, 6 us at 128K: docs/notes/cuda-decode-v11-timeline.md):
// every block normalises and rotates its G query heads from the projection's raw output (a warp per head), and the
// block whose split holds the new position computes the new key (norm + RoPE) and value, appends them to the
// caches for later steps, and writes them over the new row's slot of its last tile in shared memory once that tile
// has landed (its cp.async may read the cache row before or after the append: the overwrite makes either moot).
// The KV cache and q are written by earlier kernels of the same graph: plain `const T*` (no __restrict__, so never
// the non-coherent path), read with cp.async.cg / after the PDL wait. The position and the tiles made only of rows
// before it are requested before the wait: their writers are at least two launches back (attn_prep, the kernel
// just before, appends the rows [pos, pos + T), or with PREP this kernel itself; every kernel triggers its
// successor only after its own wait), as the split kernel does (attn.cu).
#include <cuda_bf16.h>

#include <string>

#include "cuda/attn_decode_tc.h"
#include "cuda/cuda_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int BN = 64;  // keys per tile: one 8-key n-tile of S per warp
constexpr int kStages = 3;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using ptx::cp_async16;
using ptx::ldmatrix_x4;
using ptx::fast_exp2;
using ptx::ldmatrix_x4_trans;

// Two floats as one register of bf16 operands (.x, the low half, = lo).
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x0, x1 as a bf16 pair `hi` and the pair of their remainders `lo` (x - hi is exact in fp32; its own bf16 rounding
// leaves ~2^-17 of x).
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = bf16x2(x0, x1);
  lo = bf16x2(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
}

// Element offset of 16-byte chunk `ch` of row `row` in a [rows, D] bf16 tile, chunks XOR-swizzled by row % 8 so
// that the 8 rows one ldmatrix reads at the same column fall in different bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int ch) {
  return row * D + ((ch ^ (row & 7)) << 3);
}

// PREP adds the normed query heads (fp32 [8][D]), the new key before RoPE (fp32 [D]), the new K/V rows (bf16
// [2][D]) and the rotation's cos / sin table (fp32, rot <= D entries).
template <int D, bool PREP = false>
constexpr size_t smem_bytes() {
  return size_t(2 * kStages * BN + 16) * D * 2 + size_t(BN / 16) * 32 * 16 + kWarps * 8 * 4 +
         (PREP ? size_t(10 * D) * 4 + size_t(2 * D) * 2 : 0);
}

// The raw inputs of attn_prep's work (PREP): the projection outputs and the norms' weights.
struct PrepIn {
  const float* qg;  // [Hq][query D | gate D]
  const float* k;   // [Hkv][D]
  const float* v;   // [Hkv][D]
  const float* q_norm;
  const float* k_norm;
  uint16_t* k_cache;  // where the new row is appended
  uint16_t* v_cache;
};

// The rotation at `pos` for pair i < rot / 2: tab[i] = cos, tab[rot / 2 + i] = sin (rope_sincos, as the other
// preps), once per block instead of once per element (sincosf of large angles is slow).
__device__ __forceinline__ void rope_table(float* tab, int64_t pos, const AttnShape& sh) {
  const int half = sh.rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    rope_sincos(sh.theta, sh.rot, pos, i, tab[half + i], tab[i]);
  }
}
// Element d of a normed head `n` after partial RoPE (the table above).
__device__ __forceinline__ float rope_at(const float* n, int d, const float* tab, const AttnShape& sh) {
  if (d >= sh.rot) return n[d];
  const int half = sh.rot / 2;
  const int i = d < half ? d : d - half;
  const float cs = tab[i], sn = tab[half + i];
  const float a = n[i], bb = n[i + half];
  return d < half ? a * cs - bb * sn : bb * cs + a * sn;
}

// One warp: out[d] = x[d] * rsqrt(mean(x^2) + eps) * w[d] over D elements (D / 32 per lane).
template <int D>
__device__ __forceinline__ void warp_rmsnorm(const float* x, const float* __restrict__ w, float eps, float* out,
                                             int lane) {
  constexpr int PL = D / 32;
  float v[PL];
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < PL; ++u) {
    v[u] = x[lane + 32 * u];
    ss += v[u] * v[u];
  }
  const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
  for (int u = 0; u < PL; ++u) out[lane + 32 * u] = v[u] * inv * __ldg(w + lane + 32 * u);
}

template <int D, bool PREP>
__global__ void __launch_bounds__(kThreads, 1)
    attn_decode_tc_kernel(AttnShape sh, const int32_t* __restrict__ d_pos, const float* q, const uint16_t* k_cache,
                          const uint16_t* v_cache, float* __restrict__ part_ml, float* __restrict__ part_acc, int G,
                          PrepIn pin) {
  constexpr int CH = D / 8;          // 16-byte chunks per row
  constexpr int DW = D / kWarps;     // output dims per warp in P V
  constexpr int NT = DW / 8;         // its 8-dim n-tiles
  constexpr int KK = D / 16;         // 16-dim k-steps of S
  constexpr int CPT = BN * CH / kThreads;  // chunks of a K (and of a V) tile per thread
  static_assert(NT % 2 == 0 && KK % 2 == 0 && CPT * kThreads == BN * CH, "tile shape");
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* Ks = smem;                                         // [kStages][BN][D]
  uint16_t* Vs = Ks + kStages * BN * D;                        // [kStages][BN][D]
  uint16_t* Qs = Vs + kStages * BN * D;                        // [16][D]: rows 0-7 q hi, 8-15 q lo
  uint4* Ps = reinterpret_cast<uint4*>(Qs + 16 * D);           // [BN / 16][32 lanes]: P A fragments
  float* red = reinterpret_cast<float*>(Ps + (BN / 16) * 32);  // [kWarps][8 heads]
  float* qn = red + kWarps * 8;                                // PREP: [8][D] normed query heads
  float* kn = qn + 8 * D;                                      // PREP: [D] normed new key
  uint16_t* kvnew = reinterpret_cast<uint16_t*>(kn + D);       // PREP: [2][D] new K row, new V row (bf16)
  float* rtab = reinterpret_cast<float*>(kvnew + 2 * D);       // PREP: cos / sin per rotary pair

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;  // accumulator row (head) and column pair of this lane
  const int kvh = blockIdx.x, sp = blockIdx.y, t = blockIdx.z, nsplit = gridDim.y;
  const int64_t pos0 = d_pos[0];
  const int64_t L = pos0 + t + 1;  // keys row t sees
  const int64_t tiles_all = (L + BN - 1) / BN;
  const int64_t per_split = (tiles_all + nsplit - 1) / nsplit;
  const int64_t j_begin = int64_t(sp) * per_split;
  const int64_t j_end = tiles_all < j_begin + per_split ? tiles_all : j_begin + per_split;
  const int n_tiles = j_end > j_begin ? int(j_end - j_begin) : 0;
  const int64_t row_stride = int64_t(sh.Hkv) * D;

  // Tile j_begin + i into stage i % kStages; rows at or past L are zero-filled (never read from the cache), so a
  // masked key's V row is 0 and not whatever bits lie there.
  auto load_tile = [&](int i) {
    uint16_t* ks = Ks + (i % kStages) * BN * D;
    uint16_t* vs = Vs + (i % kStages) * BN * D;
    const int64_t k0 = (j_begin + i) * BN;
#pragma unroll
    for (int u = 0; u < CPT; ++u) {
      const int idx = tid + u * kThreads;
      const int r = idx / CH, ch = idx % CH;
      const bool ok = k0 + r < L;
      const int64_t off = (ok ? k0 + r : 0) * row_stride + int64_t(kvh) * D + ch * 8;
      cp_async16(ks + swz<D>(r, ch), k_cache + off, ok);
      cp_async16(vs + swz<D>(r, ch), v_cache + off, ok);
    }
  };
  // Prologue: kStages - 1 commit groups, group i = tile i (empty past the split). Tiles whose rows all precede the
  // position go before the PDL wait; the one holding the new row (always the split's last) after it.
  int pre = 0;
  for (; pre < kStages - 1 && pre < n_tiles && (j_begin + pre + 1) * BN <= pos0; ++pre) {
    load_tile(pre);
    ptx::cp_commit();
  }
  pdl_wait();
  pdl_trigger();
  for (int i = pre; i < kStages - 1; ++i) {
    if (i < n_tiles) load_tile(i);
    ptx::cp_commit();
  }
  // PREP: the block whose split holds the new position (row pos0 of one query row) makes the new K/V row.
  const bool owner = PREP && n_tiles > 0 && pos0 >= j_begin * BN && pos0 < j_end * BN && pos0 < sh.capacity;
  if constexpr (PREP) {
    if (warp < G) warp_rmsnorm<D>(pin.qg + int64_t(kvh * G + warp) * 2 * D, pin.q_norm, sh.eps, qn + warp * D, lane);
    if (owner && warp == (G < kWarps ? G : 0)) warp_rmsnorm<D>(pin.k + int64_t(kvh) * D, pin.k_norm, sh.eps, kn, lane);
    rope_table(rtab, pos0, sh);
    __syncthreads();
    if (owner) {
      const int64_t dst = pos0 * row_stride + int64_t(kvh) * D;
      for (int d = tid; d < D; d += kThreads) {
        const uint16_t kb = f32_to_bf16(rope_at(kn, d, rtab, sh));
        const uint16_t vb = f32_to_bf16(pin.v[int64_t(kvh) * D + d]);
        kvnew[d] = kb;
        kvnew[D + d] = vb;
        pin.k_cache[dst + d] = kb;
        pin.v_cache[dst + d] = vb;
      }
    }
  }

  // q of the block's G heads, times 1/sqrt(D) * log2(e), as hi/lo bf16 rows; padding heads (g >= G) zero.
  const float qscale = rsqrtf(float(D)) * kLog2e;
  for (int idx = tid; idx < 8 * CH; idx += kThreads) {
    const int r = idx / CH, ch = idx % CH;
    uint4 hi = make_uint4(0, 0, 0, 0), lo = make_uint4(0, 0, 0, 0);
    if (r < G) {
      float4 a, b;
      if constexpr (PREP) {
        float x[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = rope_at(qn + r * D, ch * 8 + e, rtab, sh);
        a = make_float4(x[0], x[1], x[2], x[3]);
        b = make_float4(x[4], x[5], x[6], x[7]);
      } else {
        const float4* src = reinterpret_cast<const float4*>(q + (int64_t(t) * sh.Hq + kvh * G + r) * D + ch * 8);
        a = src[0];
        b = src[1];
      }
      split_bf16x2(a.x * qscale, a.y * qscale, hi.x, lo.x);
      split_bf16x2(a.z * qscale, a.w * qscale, hi.y, lo.y);
      split_bf16x2(b.x * qscale, b.y * qscale, hi.z, lo.z);
      split_bf16x2(b.z * qscale, b.w * qscale, hi.w, lo.w);
    }
    *reinterpret_cast<uint4*>(Qs + swz<D>(r, ch)) = hi;
    *reinterpret_cast<uint4*>(Qs + swz<D>(r + 8, ch)) = lo;
  }
  __syncthreads();
  uint32_t qa[KK][4];  // A fragments of every k-step, kept for the whole split
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) ldmatrix_x4(qa[kk], Qs + swz<D>(lane & 15, kk * 2 + (lane >> 4)));

  float m_run = -INFINITY;  // running max of head g (log2 domain), the same in every warp
  float l_run = 0.0f;       // this lane's share of head g's sum over this warp's keys
  float acc[NT][4];         // rows g (P hi) and g + 8 (P lo) x this warp's dims
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int i = 0; i < n_tiles; ++i) {
    ptx::cp_wait<kStages - 2>();
    __syncthreads();  // tile i landed for every thread; every warp is done with tile i - 1 and the P of i - 1
    if (i + kStages - 1 < n_tiles) load_tile(i + kStages - 1);  // into tile i - 1's stage
    ptx::cp_commit();
    const uint16_t* ks = Ks + (i % kStages) * BN * D;
    const uint16_t* vs = Vs + (i % kStages) * BN * D;
    if (PREP && owner && i == n_tiles - 1) {  // the new row's slot held the cache's old contents
      const int r = int(pos0 - (j_begin + i) * BN);
      for (int ch = tid; ch < 2 * CH; ch += kThreads) {
        uint16_t* dst = (ch < CH ? Ks : Vs) + (i % kStages) * BN * D + swz<D>(r, ch % CH);
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(kvnew + (ch < CH ? 0 : D) + (ch % CH) * 8);
      }
      __syncthreads();
    }

    // S for the warp's 8 keys over all dims; even and odd k-steps in two accumulators (two chains of KK / 2).
    float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kk = 0; kk < KK; kk += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + swz<D>(warp * 8 + (lane & 7), kk * 2 + (lane >> 3)));
      ptx::mma16816<false>(s0, qa[kk], b[0], b[1]);
      ptx::mma16816<false>(s1, qa[kk + 1], b[2], b[3]);
    }
    const int64_t key0 = (j_begin + i) * BN + warp * 8 + 2 * c;
    float sc[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      sc[e] = (s0[e] + s1[e]) + (s0[2 + e] + s1[2 + e]);  // q hi . k + q lo . k
      if (key0 + e >= L) sc[e] = -INFINITY;
    }
    float mx = fmaxf(sc[0], sc[1]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (c == 0) red[warp * 8 + g] = mx;
    __syncthreads();
    float mt = red[g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mt = fmaxf(mt, red[w * 8 + g]);
    const float m_new = fmaxf(m_run, mt);         // finite: a tile's first key is always visible
    const float corr = fast_exp2(m_run - m_new);  // 0 on the first tile
    m_run = m_new;
    const float p0 = fast_exp2(sc[0] - m_new), p1 = fast_exp2(sc[1] - m_new);  // 0 where masked
    l_run = l_run * corr + (p0 + p1);
    uint32_t phi, plo;
    split_bf16x2(p0, p1, phi, plo);
    // The warp's keys are half (warp & 1) of 16-key step warp / 2: A registers {hi, lo} = {a0, a1} or {a2, a3}.
    reinterpret_cast<uint2*>(&Ps[(warp >> 1) * 32 + lane])[warp & 1] = make_uint2(phi, plo);
    if (corr != 1.0f) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        acc[n][0] *= corr;
        acc[n][1] *= corr;
        acc[n][2] *= corr;
        acc[n][3] *= corr;
      }
    }
    __syncthreads();  // P of all 64 keys published

    // O += P V for the warp's dims [warp * DW, warp * DW + DW).
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const uint4 pa = Ps[j * 32 + lane];
      const uint32_t a[4] = {pa.x, pa.y, pa.z, pa.w};
#pragma unroll
      for (int dp = 0; dp < NT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + swz<D>(j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7),
                                         warp * (DW / 8) + dp * 2 + (lane >> 4)));
        ptx::mma16816<false>(acc[2 * dp], a, b[0], b[1]);
        ptx::mma16816<false>(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
  ptx::cp_wait<0>();

  // Partials: the sum of head g over the quad and the warps, the output rows hi + lo, the max in natural-log units
  // (the combine's convention).
  float l = l_run;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();  // every read of the last tile's maxima is done
  if (c == 0) red[warp * 8 + g] = l;
  __syncthreads();
  if (g < G) {
    const int64_t row = (int64_t(t) * sh.Hq + kvh * G + g) * nsplit + sp;
    float* out = part_acc + row * D + warp * DW + 2 * c;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<float2*>(out + n * 8) = make_float2(acc[n][0] + acc[n][2], acc[n][1] + acc[n][3]);
    if (warp == 0 && c == 0) {
      float lt = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) lt += red[w * 8 + g];
      part_ml[row * 2] = m_run * kLn2;  // -inf for an empty split
      part_ml[row * 2 + 1] = lt;
    }
  }
}

template <int D, bool PREP = false>
void launch_tc(const Ctx& c, dim3 grid, const AttnShape& sh, const int32_t* d_pos, const float* q, const uint16_t* kc,
               const uint16_t* vc, float* pml, float* pacc, int G, const PrepIn& pin = {}) {
  allow_dynamic_smem<attn_decode_tc_kernel<D, PREP>>(smem_bytes<D, PREP>());
  launch(c, "attn_decode_tc_kernel", attn_decode_tc_kernel<D, PREP>, grid, kThreads, smem_bytes<D, PREP>(), sh, d_pos,
         q, kc, vc, pml, pacc, G, pin);
}

}  // namespace

bool attn_decode_tc_ok(const AttnShape& sh) {
  if (sh.Hkv < 1 || sh.Hq % sh.Hkv != 0) return false;
  const int G = sh.Hq / sh.Hkv;
  return (sh.D == 128 || sh.D == 256) && (G == 1 || G == 2 || G == 4 || G == 8);
}

namespace {
// The head shapes attn_decode_tc_ok takes, or a user error naming the shape.
void check_tc_shape(const AttnShape& sh) {
  if (!attn_decode_tc_ok(sh))
    raise_error("attention (tensor-core decode): unsupported head shape (head_dim " + std::to_string(sh.D) + ", " +
                std::to_string(sh.Hkv > 0 ? sh.Hq / sh.Hkv : 0) +
                " query heads per KV head; supported: head_dim 128/256, 1/2/4/8 per KV head)");
}
}  // namespace

void attn_decode_tc(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                    const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o,
                    int T, int nsplit) {
  if (T <= 0) return;
  check_tc_shape(sh);
  FERN_CU_CHECK(nsplit >= 1, "attention: split count");  // the upper bound is the combine's
  const dim3 grid(sh.Hkv, nsplit, T);
  const int G = sh.Hq / sh.Hkv;
  if (sh.D == 256) launch_tc<256>(c, grid, sh, d_pos, q, k_cache, v_cache, part_ml, part_acc, G);
  else launch_tc<128>(c, grid, sh, d_pos, q, k_cache, v_cache, part_ml, part_acc, G);
  FERN_CUDA_LAUNCH_CHECK("attn_decode_tc_kernel");
  attn_decode_combine(c, sh, nsplit, part_ml, part_acc, qg, o, T);
}

void attn_decode_tc_prep(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* qg, const float* k,
                         const float* v, const float* q_norm, const float* k_norm, uint16_t* k_cache,
                         uint16_t* v_cache, float* part_ml, float* part_acc, float* o, int nsplit) {
  check_tc_shape(sh);
  FERN_CU_CHECK(nsplit >= 1, "attention: split count");
  FERN_CU_CHECK(sh.rot % 2 == 0 && sh.rot <= sh.D, "attention: rotary dims");
  const dim3 grid(sh.Hkv, nsplit, 1);
  const int G = sh.Hq / sh.Hkv;
  const PrepIn pin{qg, k, v, q_norm, k_norm, k_cache, v_cache};
  if (sh.D == 256) launch_tc<256, true>(c, grid, sh, d_pos, nullptr, k_cache, v_cache, part_ml, part_acc, G, pin);
  else launch_tc<128, true>(c, grid, sh, d_pos, nullptr, k_cache, v_cache, part_ml, part_acc, G, pin);
  FERN_CUDA_LAUNCH_CHECK("attn_decode_tc_kernel");
  attn_decode_combine(c, sh, nsplit, part_ml, part_acc, qg, o, 1);
}

}  // namespace fern::cuda
