// Causal GQA attention for a chunk of prompt rows, flash-attention style on the tensor cores (attn_prefill.h).
//
// A block owns one KV head and a tile of 128 query rows: 128 / G consecutive token rows times the G query heads that
// share the KV head (row r = token r / G, head r % G), so every K/V tile staged in shared memory serves all G heads.
// It walks the KV positions in tiles of 64 (cp.async, double buffered): each of the 8 warps computes the 16 x 64
// scores of its 16 rows (S = Q K^T, mma.sync m16n8k16 with fp32 accumulation), applies the causal mask (only
// on tiles that reach past the tile's first token), updates its rows' running max and sum in fp32 (exp2 domain),
// rescales its 16 x D output accumulator and adds P V with P rounded straight from the score registers.
// MMA operands (F16 = true, the default): q and P rounded to fp16 (11 significant bits), and the BF16 cache rows
// converted to fp16 in shared memory by the thread that copied them, right after its copies land (exact: 8 bits fit
// in 11; values past the fp16 range saturate at +-65504 instead of becoming infinite). The whole-model bisect
// (docs/PERF.md, third session) found bf16 q and P (F16 = false, FERN_ATTN_PREFILL=flash-bf16) to be the largest
// difference of the GPU prefill from the fp32 CPU backend (NMSE 4e-5 against 1e-7 with the fp32 decode kernel);
// fp16 cuts each of those two roundings by 4x in size.
// Shared-memory rows are XOR-swizzled in 16-byte chunks so that ldmatrix reads hit distinct banks.
// With nsplit > 1 (small T over a long cache) each block covers one slice of the KV tiles and writes unnormalised
// partials that attn_prefill_combine merges (and gates).
// KV16 (with F16): the cache rows arrive already converted to fp16 by kv_to_f16_kernel, once per layer and chunk,
// instead of once per (query tile, KV tile) in every block: the same conversion, so the same bits. (The in-kernel
// conversion measured +32% on the kernel at long caches, docs/notes/cuda-prefill-v3-attn.md; a 8,192-row chunk has
// 512 query tiles per KV head, each converting every KV tile it reads.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "cuda/attn_prefill.h"
#include "cuda/attn_prefill_tile.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda {
namespace {

constexpr int kWarps = kAttnPrefillRows / 16;
constexpr int kThreads = kWarps * 32;
constexpr int BM = kAttnPrefillRows;
constexpr int BN = kAttnPrefillKeys;

using ptx::cp_async16;
using ptx::ldmatrix_x4;
using ptx::ldmatrix_x4_trans;

// The same in place (a 16-byte chunk of shared memory).
__device__ __forceinline__ void chunk_bf16_to_f16(uint16_t* p) {
  uint4* c = reinterpret_cast<uint4*>(p);
  *c = bf16x8_to_f16(*c);
}

// Element offset of 16-byte chunk `ch` of row `row` in a [rows, D] bf16 tile: chunks XOR-swizzled by row % 8, so
// the 8 rows an ldmatrix reads at the same column land in 8 different bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int ch) {
  return row * D + ((ch ^ (row & 7)) << 3);
}

// Rows [0, d_pos[0] + T) of both bf16 caches to fp16 (the prefix the chunk's attention reads; rows are contiguous
// from the start of a cache), at most `rows` rows: the copies' size. Grid-stride over 16-byte chunks. v16 == nullptr:
// the keys only (the wgmma kernel takes the values transposed, attn_prefill_wg.cu).
constexpr int kConvThreads = 256;
__global__ void __launch_bounds__(kConvThreads)
    kv_to_f16_kernel(const int32_t* __restrict__ d_pos, int T, int64_t rows, int64_t row_elems,
                     const uint16_t* __restrict__ k, const uint16_t* __restrict__ v, uint16_t* __restrict__ k16,
                     uint16_t* __restrict__ v16) {
  pdl_wait();
  pdl_trigger();
  const long long used = static_cast<long long>(d_pos[0]) + T;
  const int64_t n = static_cast<int64_t>(used < rows ? used : rows) * row_elems / 8;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < n; c += int64_t(gridDim.x) * blockDim.x) {
    reinterpret_cast<uint4*>(k16)[c] = bf16x8_to_f16(reinterpret_cast<const uint4*>(k)[c]);
    if (v16 != nullptr) reinterpret_cast<uint4*>(v16)[c] = bf16x8_to_f16(reinterpret_cast<const uint4*>(v)[c]);
  }
}

template <int D, bool F16, bool KV16>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_kernel(AttnShape sh, const int32_t* __restrict__ d_pos, const float* __restrict__ q,
                        const float* __restrict__ qg, const uint16_t* __restrict__ k_cache,
                        const uint16_t* __restrict__ v_cache, float* __restrict__ part_ml,
                        float* __restrict__ part_acc, float* __restrict__ o, int T, int G) {
  constexpr int CH = D / 8;  // 16-byte chunks per row
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* Qs = smem;             // [BM, D]
  uint16_t* Ks = Qs + BM * D;      // [2][BN, D]
  uint16_t* Vs = Ks + 2 * BN * D;  // [2][BN, D]

  pdl_wait();
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const AttnTile tl = attn_tile<BM, BN>(d_pos, T, G);
  const int kvh = tl.kvh, kv_len = tl.kv_len;

  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};
  float oacc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.0f;

  if (tl.j_begin < tl.j_end) {
    auto load_kv = [&](int j, int buf) {
      uint16_t* ks = Ks + buf * BN * D;
      uint16_t* vs = Vs + buf * BN * D;
      for (int c = tid; c < BN * CH; c += kThreads) {
        const int r = c / CH, ch = c % CH;
        const int key = j * BN + r;
        const bool ok = key < kv_len;
        const int64_t off = (int64_t(ok ? key : 0) * sh.Hkv + kvh) * D + ch * 8;
        cp_async16(ks + swz<D>(r, ch), k_cache + off, ok);
        cp_async16(vs + swz<D>(r, ch), v_cache + off, ok);
      }
    };
    // F16: the chunks this thread copied for tile j, converted in place once they have landed (a thread sees its own
    // cp.async writes after cp.async.wait_group, so no barrier is needed before the conversion; the barrier after it
    // publishes the converted tile to the other warps).
    auto convert_kv = [&](int buf) {
      uint16_t* ks = Ks + buf * BN * D;
      uint16_t* vs = Vs + buf * BN * D;
      for (int c = tid; c < BN * CH; c += kThreads) {
        const int r = c / CH, ch = c % CH;
        chunk_bf16_to_f16(ks + swz<D>(r, ch));
        chunk_bf16_to_f16(vs + swz<D>(r, ch));
      }
    };
    load_kv(tl.j_begin, 0);
    ptx::cp_commit();
    // Q tile: fp32 -> fp16 / bf16 (round to nearest), padding rows zero.
    for (int c = tid; c < BM * CH; c += kThreads) {
      const int r = c / CH, ch = c % CH;
      *reinterpret_cast<uint4*>(Qs + swz<D>(r, ch)) = q_chunk<F16, D>(q, sh, tl, T, G, r, ch);
    }
    const float sl2 = score_scale_log2<D>();

    for (int j = tl.j_begin; j < tl.j_end; ++j) {
      const int buf = (j - tl.j_begin) & 1;
      next_key_tile(tl, j, buf, load_kv);
      static_assert(F16 || !KV16, "fp16 cache rows are fp16 operands");
      if constexpr (F16 && !KV16) convert_kv(buf);
      __syncthreads();
      const uint16_t* ks = Ks + buf * BN * D;
      const uint16_t* vs = Vs + buf * BN * D;

      // S = Q K^T for the warp's 16 rows x BN keys.
      float s[BN / 8][4];
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, Qs + swz<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, ks + swz<D>(np * 16 + (lane >> 4) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
          ptx::mma16816<F16>(s[2 * np], a, b[0], b[1]);
          ptx::mma16816<F16>(s[2 * np + 1], a, b[2], b[3]);
        }
      }

      softmax_tile<BN>([&](int n, int qi) -> float& { return s[n][qi]; }, tl, j * BN, sl2, m_r, l_r,
                       [&](int i, float corr) {
#pragma unroll
                         for (int n = 0; n < D / 8; ++n) {
                           oacc[n][2 * i] *= corr;
                           oacc[n][2 * i + 1] *= corr;
                         }
                       });

      // O += P V: the score accumulators of two adjacent 8-key tiles are exactly the A fragment of a 16-key step.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack16<F16>(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack16<F16>(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack16<F16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack16<F16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + swz<D>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), dp * 2 + (lane >> 4)));
          ptx::mma16816<F16>(oacc[2 * dp], a, b[0], b[1]);
          ptx::mma16816<F16>(oacc[2 * dp + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();
    }
  }

  attn_epilogue<D>(sh, tl, T, G, m_r, l_r, [&](int n, int qi) -> float& { return oacc[n][qi]; }, qg, part_ml,
                   part_acc, o);
}

// One block per (head, row): merges the splits' (max in the exp2 domain, sum, unnormalised acc) and gates.
constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads) attn_prefill_combine(AttnShape sh, int nsplit,
                                                                        const float* __restrict__ part_ml,
                                                                        const float* __restrict__ part_acc,
                                                                        const float* __restrict__ qg,
                                                                        float* __restrict__ o) {
  pdl_wait();
  pdl_trigger();
  __shared__ float fac[kAttnPrefillMaxSplits];
  __shared__ float red[32];
  const int64_t row = int64_t(blockIdx.y) * sh.Hq + blockIdx.x;
  const int D = sh.D;
  const float* ml = part_ml + row * nsplit * 2;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < nsplit; s += blockDim.x) mx = fmaxf(mx, ml[2 * s]);
  const float M = block_max(mx, red);
  float den = 0.0f;
  for (int s = threadIdx.x; s < nsplit; s += blockDim.x) {
    const float ms = ml[2 * s];
    const float f = ms == -INFINITY ? 0.0f : exp2f(ms - M);
    fac[s] = f;
    den += ml[2 * s + 1] * f;
  }
  const float inv = 1.0f / block_sum(den, red);  // its barriers also publish fac
  const float* acc = part_acc + row * nsplit * D;
  const float* gate = qg + row * 2 * D + D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f;
    for (int s = 0; s < nsplit; ++s)
      if (fac[s] != 0.0f) num = fmaf(acc[int64_t(s) * D + d], fac[s], num);  // skipped splits wrote no acc
    o[row * D + d] = num * inv * sigmoid(gate[d]);
  }
}

template <int D>
constexpr size_t smem_bytes() {
  return size_t(BM + 4 * BN) * D * 2;
}

template <int D, bool F16, bool KV16>
void set_smem_attr() {
  allow_dynamic_smem<attn_prefill_kernel<D, F16, KV16>>(smem_bytes<D>());
}

// Resident blocks per SM of the fp16 kernel (a property of the kernel and the device: asked once).
template <int D>
int blocks_per_sm() {
  static const int n = [] {
    set_smem_attr<D, true, false>();
    int r = 0;
    FERN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, attn_prefill_kernel<D, true, false>, kThreads,
                                                                  smem_bytes<D>()));
    return r < 1 ? 1 : r;
  }();
  return n;
}

template <int D, bool F16, bool KV16>
void launch_flash(const Ctx& c, dim3 grid, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                  const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o, int T,
                  int G) {
  set_smem_attr<D, F16, KV16>();
  launch(c, "attn_prefill_kernel", attn_prefill_kernel<D, F16, KV16>, grid, kThreads, smem_bytes<D>(), sh, d_pos, q,
         qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
}

template <int D>
void launch_flash(const Ctx& c, bool f16, bool kv16, dim3 grid, const AttnShape& sh, const int32_t* d_pos,
                  const float* q, const float* qg, const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml,
                  float* part_acc, float* o, int T, int G) {
  if (kv16) launch_flash<D, true, true>(c, grid, sh, d_pos, q, qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
  else if (f16) launch_flash<D, true, false>(c, grid, sh, d_pos, q, qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
  else launch_flash<D, false, false>(c, grid, sh, d_pos, q, qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
}

}  // namespace

bool attn_prefill_ok(const AttnShape& sh) {
  if (sh.Hkv < 1 || sh.Hq % sh.Hkv != 0) return false;
  const int G = sh.Hq / sh.Hkv;
  return (sh.D == 64 || sh.D == 128 || sh.D == 256) && (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

int attn_prefill_splits(const AttnShape& sh, int64_t pos, int T, int sms) {
  if (!attn_prefill_ok(sh) || T <= 0) return 1;
  const int G = sh.Hq / sh.Hkv;
  const int64_t tiles_q = (int64_t(T) + BM / G - 1) / (BM / G);
  const int64_t blocks = tiles_q * sh.Hkv;
  const int per_sm = sh.D == 256 ? blocks_per_sm<256>() : sh.D == 128 ? blocks_per_sm<128>() : blocks_per_sm<64>();
  const int64_t slots = int64_t(sms) * per_sm;
  if (blocks >= slots) return 1;
  // As many pieces as keep all of them in one wave, each at least four KV tiles long.
  const int64_t kv_tiles = (pos + T + BN - 1) / BN;
  int64_t n = slots / blocks;
  n = n < kv_tiles / 4 ? n : kv_tiles / 4;
  n = n < kAttnPrefillMaxSplits ? n : kAttnPrefillMaxSplits;
  return static_cast<int>(n < 1 ? 1 : n);
}

void kv_to_f16(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const uint16_t* k_cache,
               const uint16_t* v_cache, uint16_t* k16, uint16_t* v16, int T, int64_t rows) {
  if (T <= 0 || rows <= 0) return;
  FERN_CU_CHECK(int64_t(sh.Hkv) * sh.D % 8 == 0, "kv_to_f16: rows of whole 16-byte chunks");
  const int64_t chunks = rows * sh.Hkv * sh.D / 8;
  const int64_t blocks = std::min<int64_t>((chunks + kConvThreads - 1) / kConvThreads, int64_t(c.sms) * 8);
  launch(c, "kv_to_f16_kernel", kv_to_f16_kernel, static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kConvThreads,
         0, d_pos, T, rows, int64_t(sh.Hkv) * sh.D, k_cache, v_cache, k16, v16);
  FERN_CUDA_LAUNCH_CHECK("kv_to_f16_kernel");
}

void attn_prefill(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                  const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o, int T,
                  int nsplit, bool f16, bool kv16) {
  if (T <= 0) return;
  if (!attn_prefill_ok(sh))
    raise_error("attention prefill: unsupported head shape (head_dim " + std::to_string(sh.D) + ", " +
                std::to_string(sh.Hkv > 0 ? sh.Hq / sh.Hkv : 0) + " query heads per KV head of " +
                std::to_string(sh.Hkv) + "; supported: head_dim 64/128/256, 1/2/4/8/16 per KV head)");
  FERN_CU_CHECK(f16 || !kv16, "attention prefill: fp16 cache rows need fp16 operands");
  const int G = sh.Hq / sh.Hkv;
  const dim3 grid = attn_prefill_grid(sh, T, nsplit, part_ml, part_acc);
  switch (sh.D) {
    case 256:
      launch_flash<256>(c, f16, kv16, grid, sh, d_pos, q, qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
      break;
    case 128:
      launch_flash<128>(c, f16, kv16, grid, sh, d_pos, q, qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
      break;
    default:
      launch_flash<64>(c, f16, kv16, grid, sh, d_pos, q, qg, k_cache, v_cache, part_ml, part_acc, o, T, G);
      break;
  }
  FERN_CUDA_LAUNCH_CHECK("attn_prefill_kernel");
  if (nsplit > 1) attn_prefill_merge(c, sh, nsplit, part_ml, part_acc, qg, o, T);
}

void attn_prefill_merge(const Ctx& c, const AttnShape& sh, int nsplit, const float* part_ml, const float* part_acc,
                        const float* qg, float* o, int T) {
  launch(c, "attn_prefill_combine", attn_prefill_combine, dim3(sh.Hq, T), kCombineThreads, 0, sh, nsplit, part_ml,
         part_acc, qg, o);
  FERN_CUDA_LAUNCH_CHECK("attn_prefill_combine");
}

}  // namespace fern::cuda
