// Causal GQA attention for a chunk of prompt rows on the Hopper warpgroup MMAs (the backend's choice from 128 rows
// on; measured in docs/notes/cuda-prefill-v11-attn-wg.md). The same tiling and numerics as the flash kernel
// (attn_prefill.cu): a block owns one KV head and 128 query rows (128 / G tokens x the G heads of the KV head), walks
// the visible keys in tiles of 64 (cp.async, two buffers), fp16 q and P, fp32 softmax in the exp2 domain, the same
// mask, splits and epilogue. What changes is the MMA: each of the two warpgroups computes its 64 rows' scores with
// wgmma m64n64k16 (q and the key tile from shared memory) and adds P V with m64n128k16 (P from the score registers,
// the value tile from shared memory), instead of eight warps of mma.sync m16n8k16 fed by ldmatrix.
// Operand layouts (wgmma.cuh: K-major rows of 64 fp16, 128-byte swizzle):
//  - q: head_dim / 64 column blocks of [128 rows x 64 dims]; a K step of 16 dims is 32 bytes into a block;
//  - keys: the same for the 64 keys of a tile (they are the N side of S = q K^T);
//  - values: P V needs the keys as the K side, so the values come transposed, one row of 64 keys per dim
//    ([head_dim rows x 64 keys]), from vt16, a transposed fp16 copy of the chunk's value rows made once per layer
//    and chunk (v_to_f16_t); the keys come from the fp16 copy of kv_to_f16. Both copies convert exactly as the flash
//    kernel converts in shared memory (attn_prefill_tile.cuh).
// Per key tile each warpgroup issues its 16 score MMAs, waits, runs the mask and the online softmax on the score
// registers (the accumulator layout of m64nN is the mma.sync layout per warp, so that code is the flash kernel's),
// rescales its output accumulators, issues its 8 P V MMAs and waits: no overlap inside a warpgroup yet.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "cuda/attn_prefill.h"
#include "cuda/attn_prefill_tile.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;  // two warpgroups of 64 query rows
constexpr int BM = kAttnPrefillRows;
constexpr int BN = kAttnPrefillKeys;
static_assert(BM == 128 && BN == 64, "two warpgroups of 64 rows; key tiles of one 128-byte swizzled row");
constexpr int kRowB = 128;  // bytes of one swizzled operand row: 64 fp16

// Shared memory for head dim D: q [D / 64][BM rows], keys [2][D / 64][BN rows], transposed values [2][D rows], all
// rows of 128 bytes, every block on a 1024-byte boundary (the swizzle atom).
template <int D>
struct WgSmem {
  static constexpr int KB = D / 64;
  uint8_t q[KB][BM * kRowB];
  uint8_t k[2][KB][BN * kRowB];
  uint8_t vt[2][D * kRowB];
};
template <int D>
constexpr size_t kWgSmemBytes = sizeof(WgSmem<D>) + 1024;  // + alignment slack

// The value rows a chunk reads, [0, d_pos[0] + T), transposed and converted: vt[(h * D + d) * ld + key] (fp16); keys
// from there up to ld are zero (the kernel multiplies every key of its last tile by its weight, 0 for the masked
// ones, so they must be finite). One block per (64-key tile, KV head, 64-dim tile), through a shared-memory tile.
constexpr int kTrThreads = 256;
__global__ void __launch_bounds__(kTrThreads) v_to_f16_t_kernel(const int32_t* __restrict__ d_pos, int T, int64_t ld,
                                                                int Hkv, int D, const uint16_t* __restrict__ v,
                                                                uint16_t* __restrict__ vt) {
  pdl_wait();
  pdl_trigger();
  __shared__ __align__(16) uint16_t tile[64][64 + 8];  // [key][dim]; rows of 144 bytes keep 16-byte alignment
  const long long used = static_cast<long long>(d_pos[0]) + T;
  const int64_t k0 = int64_t(blockIdx.x) * 64;
  const int h = static_cast<int>(blockIdx.y), d0 = static_cast<int>(blockIdx.z) * 64;
  for (int c = threadIdx.x; c < 64 * 8; c += kTrThreads) {
    const int r = c >> 3, ch = c & 7;
    const int64_t key = k0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (key < used)  // (key < ld: the grid is ld / 64 key tiles)
      val = bf16x8_to_f16(*reinterpret_cast<const uint4*>(v + (key * Hkv + h) * D + d0 + ch * 8));
    *reinterpret_cast<uint4*>(&tile[r][ch * 8]) = val;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 64 * 8; c += kTrThreads) {
    const int dd = c >> 3, kc = c & 7;  // dim d0 + dd, keys k0 + 8 kc .. + 7
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = uint32_t(tile[8 * kc + 2 * i][dd]) | (uint32_t(tile[8 * kc + 2 * i + 1][dd]) << 16);
    *reinterpret_cast<uint4*>(vt + (int64_t(h) * D + d0 + dd) * ld + k0 + 8 * kc) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Issues this warpgroup's score MMAs for one key tile: S = q K^T, 64 rows x 64 keys, into s (overwritten).
template <int D>
__device__ __forceinline__ void issue_scores(const WgSmem<D>& sm, int wg, int buf, float (&s)[32]) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint64_t da = wgmma::desc_sw128(&sm.q[ks >> 2][wg * 64 * kRowB + 32 * (ks & 3)]);
    const uint64_t db = wgmma::desc_sw128(&sm.k[buf][ks >> 2][32 * (ks & 3)]);
    wgmma::mma_f16_n64(s, da, db, ks > 0);
  }
}

// Issues O += P V for one key tile: the weights of two adjacent 8-key blocks are the register A fragment of a 16-key
// step (a[kk], from pack_weights), the values come transposed from vt[buf].
template <int D>
__device__ __forceinline__ void issue_pv(const WgSmem<D>& sm, int buf, const uint32_t (&a)[BN / 16][4],
                                         float (&oacc)[D / 128][64]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int h = 0; h < D / 128; ++h)
      wgmma::mma_f16_rs_n128(oacc[h], a[kk], wgmma::desc_sw128(&sm.vt[buf][128 * h * kRowB + 32 * kk]), 1);
}

// The softmax weights of a tile (in s) as fp16 A fragments.
__device__ __forceinline__ void pack_weights(const float (&s)[32], uint32_t (&a)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    a[kk][0] = pack16<true>(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack16<true>(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack16<true>(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack16<true>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Multiplies row i's output accumulators (of this thread: row r0 + 8 i) by corr.
template <int NH>
__device__ __forceinline__ void rescale_rows(float (&oacc)[NH][64], int i, float corr) {
#pragma unroll
  for (int h = 0; h < NH; ++h)
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      oacc[h][4 * n + 2 * i] *= corr;
      oacc[h][4 * n + 2 * i + 1] *= corr;
    }
}

// The loop (docs/notes/cuda-prefill-v12-attn-pipe.md; it replaced one that took each key tile's scores, softmax and
// P V in turn, with two block barriers per tile: 1.06-1.13x faster from 256 rows, the same bits): the scores of
// tile j + 1 are issued together with P V of tile j, and the softmax of tile j + 1 runs while the tensor cores
// compute that P V; its correction of the output rows waits until P V is done (the accumulators are the MMA's until
// then), and the next weights go to a second fragment set. Keys and values are copied separately, each as soon as
// its buffer is free (K of tile j + 2 once the scores of tile j are done, V of tile j + 1 once P V of tile j - 1
// is), so one block barrier per tile suffices and every copy has a whole tile of work to land under.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_wg_kernel(AttnShape sh, const int32_t* __restrict__ d_pos, const float* __restrict__ q,
                           const float* __restrict__ qg, const uint16_t* __restrict__ k16,
                           const uint16_t* __restrict__ vt16, int64_t ld, float* __restrict__ part_ml,
                           float* __restrict__ part_acc, float* __restrict__ o, int T, int G) {
  static_assert(D == 128 || D == 256, "P V runs as D / 128 MMAs of 128 dims");
  constexpr int NH = D / 128;
  extern __shared__ unsigned char attn_wg_smem[];
  WgSmem<D>& sm = wgmma::smem_at_atom<WgSmem<D>>(attn_wg_smem);

  pdl_wait();
  pdl_trigger();
  const int tid = threadIdx.x, wg = tid >> 7;
  // Warp w of the block is warp w % 4 of warpgroup w / 4, whose accumulator rows 16 (w % 4) .. of the warpgroup's 64
  // are rows 16 w .. of the block's 128: the flash kernel's rows (attn_tile).
  const AttnTile tl = attn_tile<BM, BN>(d_pos, T, G);
  const int kvh = tl.kvh, kv_len = tl.kv_len;

  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};
  // oacc[h][4 n + 2 i + e]: row r0 + 8 i, dim 128 h + 8 n + 2 (lane % 4) + e.
  float oacc[NH][64];
#pragma unroll
  for (int h = 0; h < NH; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) oacc[h][i] = 0.0f;
  // s[4 n + 2 i + e]: row r0 + 8 i, key 8 n + 2 (lane % 4) + e of the tile.
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;

  if (tl.j_begin < tl.j_end) {
    auto load_k = [&](int j, int buf) {  // keys: BN rows of D dims, in D / 64 blocks
      for (int c = tid; c < BN * (D / 8); c += kThreads) {
        const int r = c / (D / 8), ch = c % (D / 8);
        const int key = j * BN + r;
        const bool ok = key < kv_len;
        const int64_t off = (int64_t(ok ? key : 0) * sh.Hkv + kvh) * D + ch * 8;
        ptx::cp_async16(&sm.k[buf][ch >> 3][wgmma::sw128(r, ch & 7)], k16 + off, ok);
      }
    };
    auto load_v = [&](int j, int buf) {  // values: D rows of BN keys (in bounds: j < ld / BN)
      for (int c = tid; c < D * (BN / 8); c += kThreads) {
        const int d = c >> 3, ch = c & 7;
        ptx::cp_async16(&sm.vt[buf][wgmma::sw128(d, ch)],
                        vt16 + (int64_t(kvh) * D + d) * ld + int64_t(j) * BN + ch * 8);
      }
    };
    auto store_q = [&] {  // q tile: fp32 -> fp16 (round to nearest, saturating), padding rows zero
      for (int c = tid; c < BM * (D / 8); c += kThreads) {
        const int r = c / (D / 8), ch = c % (D / 8);
        *reinterpret_cast<uint4*>(&sm.q[ch >> 3][wgmma::sw128(r, ch & 7)]) = q_chunk<true, D>(q, sh, tl, T, G, r, ch);
      }
    };
    const float sl2 = score_scale_log2<D>();

    // Prologue: K of the first tile (one copy group), then K of the second and V of the first (the next group);
    // the first tile's scores and softmax.
    load_k(tl.j_begin, 0);
    ptx::cp_commit();
    store_q();
    if (tl.j_begin + 1 < tl.j_end) load_k(tl.j_begin + 1, 1);
    load_v(tl.j_begin, 0);
    ptx::cp_commit();
    ptx::cp_wait<1>();
    wgmma::fence_proxy_async();
    __syncthreads();
    wgmma::fence_operand(s);
    wgmma::fence();
    issue_scores<D>(sm, wg, 0, s);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(s);
    // Nothing accumulated yet: the first correction multiplies zeros and is skipped.
    softmax_tile<BN>([&](int n, int qi) -> float& { return s[4 * n + qi]; }, tl, tl.j_begin * BN, sl2, m_r, l_r,
                     [](int, float) {});
    uint32_t a0[BN / 16][4], a1[BN / 16][4];  // the weights of alternate tiles (no copies between them)
    pack_weights(s, a0);

    // Tile j but the last: its P V (weights in cur) with tile j + 1's scores and softmax (weights into nxt).
    auto step = [&](int j, const uint32_t(&cur)[BN / 16][4], uint32_t(&nxt)[BN / 16][4]) {
      const int buf = (j - tl.j_begin) & 1;
      // V of tile j and K of tile j + 1 landed (this thread's copies, then everyone's through the barrier); every
      // thread is past tile j - 1, so K of tile j (its scores are done) and V of tile j - 1 (its P V is done) are
      // free.
      ptx::cp_wait<0>();
      wgmma::fence_proxy_async();
      __syncthreads();
      if (j + 2 < tl.j_end) load_k(j + 2, buf);
      load_v(j + 1, buf ^ 1);
      ptx::cp_commit();

      wgmma::fence_operand(s);
#pragma unroll
      for (int h = 0; h < NH; ++h) wgmma::fence_operand(oacc[h]);
      wgmma::fence();
      issue_scores<D>(sm, wg, buf ^ 1, s);
      wgmma::commit();
      issue_pv<D>(sm, buf, cur, oacc);
      wgmma::commit();

      wgmma::wait<1>();  // the scores (committed first); P V may still run
      wgmma::fence_operand(s);
      float corr[2] = {1.0f, 1.0f};
      bool moved[2] = {false, false};  // warp-uniform, as softmax_tile's calls
      softmax_tile<BN>([&](int n, int qi) -> float& { return s[4 * n + qi]; }, tl, (j + 1) * BN, sl2, m_r, l_r,
                       [&](int i, float c) { corr[i] = c, moved[i] = true; });
      pack_weights(s, nxt);
      wgmma::wait<0>();
#pragma unroll
      for (int h = 0; h < NH; ++h) wgmma::fence_operand(oacc[h]);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (moved[i]) rescale_rows<NH>(oacc, i, corr[i]);
    };
    // The last tile's P V.
    auto last = [&](int j, const uint32_t(&cur)[BN / 16][4]) {
      ptx::cp_wait<0>();
      wgmma::fence_proxy_async();
      __syncthreads();
#pragma unroll
      for (int h = 0; h < NH; ++h) wgmma::fence_operand(oacc[h]);
      wgmma::fence();
      issue_pv<D>(sm, (j - tl.j_begin) & 1, cur, oacc);
      wgmma::commit();
      wgmma::wait<0>();
#pragma unroll
      for (int h = 0; h < NH; ++h) wgmma::fence_operand(oacc[h]);
    };
    // Two tiles per pass so that each weight set stays in its registers (a copy between them made ptxas serialize
    // the MMAs); uniform control flow inside, so that it can follow which group each wait retires.
    int j = tl.j_begin;
    for (; j + 2 < tl.j_end; j += 2) {
      step(j, a0, a1);
      step(j + 1, a1, a0);
    }
    if (j + 1 < tl.j_end) {
      step(j, a0, a1);
      last(j + 1, a1);
    } else {
      last(j, a0);
    }
  }

  attn_epilogue<D>(sh, tl, T, G, m_r, l_r, [&](int n, int qi) -> float& { return oacc[n >> 4][4 * (n & 15) + qi]; },
                   qg, part_ml, part_acc, o);
}

template <int D>
void launch_wg(const Ctx& c, dim3 grid, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
               const uint16_t* k16, const uint16_t* vt16, int64_t ld, float* part_ml, float* part_acc, float* o, int T,
               int G) {
  allow_dynamic_smem<attn_prefill_wg_kernel<D>>(kWgSmemBytes<D>);
  launch(c, "attn_prefill_wg_kernel", attn_prefill_wg_kernel<D>, grid, kThreads, kWgSmemBytes<D>, sh, d_pos, q,
         qg, k16, vt16, ld, part_ml, part_acc, o, T, G);
}

}  // namespace

bool attn_prefill_wg_ok(const AttnShape& sh) {
  return gemm_wg_supported() && attn_prefill_ok(sh) && (sh.D == 128 || sh.D == 256);
}

void v_to_f16_t(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const uint16_t* v_cache, uint16_t* vt16,
                int T, int64_t ld) {
  if (T <= 0 || ld <= 0) return;
  FERN_CU_CHECK(ld % 64 == 0 && sh.D % 64 == 0 && ld / 64 <= INT32_MAX, "v_to_f16_t: whole 64-key and 64-dim tiles");
  launch(c, "v_to_f16_t_kernel", v_to_f16_t_kernel, dim3(static_cast<unsigned>(ld / 64), sh.Hkv, sh.D / 64),
         kTrThreads, 0, d_pos, T, ld, sh.Hkv, sh.D, v_cache, vt16);
  FERN_CUDA_LAUNCH_CHECK("v_to_f16_t_kernel");
}

void attn_prefill_wg(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                     const uint16_t* k16, const uint16_t* vt16, int64_t ld, float* part_ml, float* part_acc, float* o,
                     int T, int nsplit) {
  if (T <= 0) return;
  if (!attn_prefill_wg_ok(sh))
    raise_error("attention prefill (wgmma): unsupported head shape or device (head_dim " + std::to_string(sh.D) +
                "; needs head_dim 128 or 256 and an sm_90a build on compute capability 9.0)");
  FERN_CU_CHECK(ld % 64 == 0, "attention prefill (wgmma): the transposed values' row length is whole 64-key tiles");
  const int G = sh.Hq / sh.Hkv;
  const dim3 grid = attn_prefill_grid(sh, T, nsplit, part_ml, part_acc);
  const auto run = sh.D == 256 ? launch_wg<256> : launch_wg<128>;
  run(c, grid, sh, d_pos, q, qg, k16, vt16, ld, part_ml, part_acc, o, T, G);
  FERN_CUDA_LAUNCH_CHECK("attn_prefill_wg_kernel");
  if (nsplit > 1) attn_prefill_merge(c, sh, nsplit, part_ml, part_acc, qg, o, T);
}

}  // namespace fern::cuda
