// The Gated DeltaNet step and its out_proj GEMV in one launch (decode, one token row; docs/notes/cuda-decode-v18-gdn-out.md).
// Separately (gdn.cu, then linear.cu linear_gated_norm) the out_proj GEMV's blocks become resident, and request
// their 4.7 MB of weights, only once the step kernel's blocks leave, and its input row is staged after a kernel
// boundary. Here each block of the step's grid (Hv x Dv/32 blocks) first hands its share of out_proj's 16-row tiles
// to the copy engine (three bulk copies per tile: codes, scales, biases; one mbarrier each), then runs the step
// (gdn_step_block.cuh, unchanged), meets the other blocks at a grid barrier (every raw output written), stages the
// gated norm of the whole raw output into the tensor-core GEMV's table (gated_norm_stage.cuh, gemv_tc.cuh) and
// multiplies its tiles, which arrived during the step, from shared memory. The partial row sums of each tile's
// 256-wide K blocks go to shared memory and are added per row in K order (deterministic).
// Deadlock freedom: the grid barrier needs every block resident at once; the host launches only a grid that fits
// the GPU at one time (occupancy times SMs), and a block waits only for blocks of its own grid, which become
// resident as the kernel before leaves (it does not wait for this one).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/gated_norm_stage.cuh"
#include "cuda/gdn_step_block.cuh"
#include "cuda/gemv_tc.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda {
namespace {

constexpr int NT = kGdnThreads;
constexpr int kMaxTiles = 8;
constexpr int kBarBytes = kMaxTiles * 8;
constexpr int kNV = 4;  // float4s of the normed row per thread: rows up to 4 * NT * kNV = 4096 wide

// Bytes of one tile in shared memory: 16 rows of codes (K / 2 bytes each), then 16 rows of G bf16 scales, then of
// G bf16 biases.
__host__ __device__ constexpr int tile_bytes(int K, int G) { return 16 * (K / 2) + 2 * (16 * G * 2); }

struct OutArgs {
  QW w;                 // out_proj [H, V], 4-bit, groups a multiple of 64 (gdn_out_fused checks)
  const float* z;       // [V], the gate input
  const float* norm_w;  // [Dv]
  float eps;
  float* out;           // [H]
  int tiles, tpb;       // 16-row tiles of out_proj; the most any block takes
  int* barrier;         // two ints: arrivals, generation (zero before the first launch)
};

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// All blocks of the grid meet; every thread's writes before it are visible to every thread after it. A
// sense-reversing counter: thread 0 reads the generation (it cannot change before this block arrives), fences and
// counts the block in; the last block resets the count and advances the generation, the others wait for it. The
// count is zero again when the next launch uses it.
__device__ __forceinline__ void grid_barrier(int* cnt, int* gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const int g0 = ld_acquire(gen);
    __threadfence();
    if (atomicAdd(cnt, 1) == int(gridDim.x * gridDim.y) - 1) {
      atomicExch(cnt, 0);
      __threadfence();
      atomicAdd(gen, 1);
    } else {
      while (ld_acquire(gen) == g0) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

template <int MAXKS>
__global__ void __launch_bounds__(NT, 1)
    gdn_out_kernel(GdnShape sh, const float* mixed, const float* bgate, const float* agate,
                   const float* __restrict__ conv_w, const float* __restrict__ A_log,
                   const float* __restrict__ dt_bias, float* conv_state, float* state, float* y, int* counters,
                   int early_state, OutArgs o) {
  extern __shared__ float4 smem[];
  constexpr int W = NT / 32;
  const int K = static_cast<int>(o.w.in), H = static_cast<int>(o.w.out);
  const int KB = tc_blocks(K), cpr = K / 32, G = K / o.w.gs;
  const int gsh = __ffs(o.w.gs / 32) - 1;  // chunks per group: a power of two (make_qw)
  const int TB = tile_bytes(K, G);
  const int nblk = static_cast<int>(gridDim.x * gridDim.y);
  const int blk = static_cast<int>(blockIdx.x * gridDim.y + blockIdx.y);
  const int tile0 = static_cast<int>(int64_t(blk) * o.tiles / nblk);
  const int ntl = static_cast<int>(int64_t(blk + 1) * o.tiles / nblk) - tile0;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* wsm = reinterpret_cast<unsigned char*>(smem) + kBarBytes;
  uint4* xb = reinterpret_cast<uint4*>(wsm + size_t(o.tpb) * TB);
  float* xg = reinterpret_cast<float*>(xb + tc_table_uint4s(K));
  float* red = xg + KB * 4;  // [tpb][KB][16] partial row sums

  // out_proj's weights depend on no kernel: requested first, so that they arrive during the step.
  if (threadIdx.x == 0) {
    for (int i = 0; i < ntl; ++i) ptx::mbar_init(bar + i, 1);
    ptx::bulk_fence_init();
    const unsigned char* w = static_cast<const unsigned char*>(o.w.w);
    for (int i = 0; i < ntl; ++i) {
      const int r0 = (tile0 + i) * 16, n = min(16, H - r0);
      unsigned char* d = wsm + size_t(i) * TB;
      const uint32_t cb = uint32_t(n) * (K / 2), sb = uint32_t(n) * G * 2;
      ptx::mbar_arrive_expect_tx(bar + i, cb + 2 * sb);
      ptx::bulk_g2s(d, w + int64_t(r0) * (K / 2), cb, bar + i);
      ptx::bulk_g2s(d + 16 * (K / 2), o.w.s + int64_t(r0) * G, sb, bar + i);
      ptx::bulk_g2s(d + 16 * (K / 2) + 16 * G * 2, o.w.b + int64_t(r0) * G, sb, bar + i);
    }
  }
  const float4 gnw = __ldg(reinterpret_cast<const float4*>(o.norm_w) + threadIdx.x % (sh.Dv / 4));

  gdn_step_block<MAXKS>(sh, mixed, bgate, agate, conv_w, A_log, dt_bias, conv_state, state, y, counters, early_state);
  grid_barrier(o.barrier, o.barrier + 1);

  // The gated norm of the whole raw output (every block's y is written), into the tensor cores' B table.
  float4 gv[kNV];
  tc_zero_tail(xb, xg, K);
  stage_x_gated_norm<NT>(y, o.z, gv, false, gnw, o.eps, K, sh.Dv, TcSink{xb, xg});

  // This block's tile x K-block items, round-robin over its warps (gemv_tc.cuh's inner loop from shared memory).
  // Lane (g, j) reads chunks 2j and 2j + 1 of row g; rows are K / 2 bytes apart (a multiple of 128, every row starts
  // on bank 0), so the odd rows of each quarter-warp read their second chunk first: 8 different bank groups.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, j = lane & 3;
  const int bq = (g >> 1) == j ? g : -1;
  const int sw = g & 1;
  for (int it = warp; it < ntl * KB; it += W) {
    const int tl = it / KB, kb = it - tl * KB;
    const int r0 = (tile0 + tl) * 16;
    const unsigned char* tb = wsm + size_t(tl) * TB;
    const uint4* tw = reinterpret_cast<const uint4*>(tb);
    const uint16_t* ts = reinterpret_cast<const uint16_t*>(tb + 16 * (K / 2));
    const uint16_t* tbi = ts + 16 * G;
    const int c0 = kb * 8 + 2 * j;  // chunks c0, c0 + 1: group j of K block kb (cpr is even: K % 64 == 0)
    ptx::mbar_wait(bar + tl, 0);
    TcItem cur;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      if (r0 + row < H && c0 < cpr) {
        const uint4* p = tw + (row * cpr + c0);
        const uint4 u = p[sw], v = p[sw ^ 1];
        cur.w[2 * r] = sw ? v : u;
        cur.w[2 * r + 1] = sw ? u : v;
        const int gi = row * G + (c0 >> gsh);
        cur.s[r] = bf16_to_f32(ts[gi]);
        cur.b[r] = bf16_to_f32(tbi[gi]);
      } else {
        cur.w[2 * r] = cur.w[2 * r + 1] = make_uint4(0, 0, 0, 0);
        cur.s[r] = cur.b[r] = 0.0f;
      }
    }
    float acc[2] = {0.0f, 0.0f};
    tc_item(cur, xb, xg, kb, j, bq, acc);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
    }
    if (j < 2) red[(tl * KB + kb) * 16 + g + 8 * j] = j == 0 ? acc[0] : acc[1];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < ntl * 16; e += NT) {
    const int tl = e >> 4, r = e & 15, row = (tile0 + tl) * 16 + r;
    float v = 0.0f;
    for (int kb = 0; kb < KB; ++kb) v += red[(tl * KB + kb) * 16 + r];
    if (row < H) o.out[row] = v;
  }
}

std::atomic<uint64_t> g_launches{0};

// Compute capability 9.0 or later on the current device (the copy engine's bulk copies), cached per device.
bool device_sm90() {
  thread_local int dev = -1, major = 0;
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) return false;
  if (d != dev) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess) major = 0;
    dev = d;
  }
  return major >= 9;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr size_t kMaxSmem = 200 * 1024;

// Blocks of gdn_out_kernel<MAXKS> that fit on the GPU at once with `smem` bytes of dynamic shared memory.
template <int MAXKS>
int resident_blocks(const Ctx& c, size_t smem) {
  allow_dynamic_smem<gdn_out_kernel<MAXKS>>(kMaxSmem);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gdn_out_kernel<MAXKS>, NT, smem) != cudaSuccess)
    return 0;
  return per_sm * c.sms;
}

}  // namespace

bool gdn_out_wanted() {
  const char* e = std::getenv("FERN_CUDA_GDN_OUT");
  if (e == nullptr || std::strcmp(e, "separate") == 0) return false;
  if (std::strcmp(e, "fused") == 0 || std::strcmp(e, "fused1") == 0) return true;
  raise_error(std::string("FERN_CUDA_GDN_OUT=") + e + ": expected separate, fused or fused1");
}

namespace {
// "fused1": the launch asks for enough shared memory that one block fits per SM (a probe: are blocks packed two or
// three to an SM, as the kernel before leaves, slower than spread?).
bool one_per_sm() {
  const char* e = std::getenv("FERN_CUDA_GDN_OUT");
  return e != nullptr && std::strcmp(e, "fused1") == 0;
}
}  // namespace

uint64_t gdn_out_fused_launches() { return g_launches.load(std::memory_order_relaxed); }

bool gdn_out_fused(const Ctx& c, const GdnShape& sh, const float* mixed, const float* b, const float* a,
                   const float* conv_w, const float* A_log, const float* dt_bias, float* conv_state, float* state,
                   float* y, bool early_state, const QW& w, const float* z, const float* norm_w, float* out,
                   int* barrier) {
  const int64_t V = int64_t(sh.Hv) * sh.Dv;
  if (!gdn_block_shape_ok(sh) || w.bits != 4 || w.experts != 0 || w.in != V || w.gs % 64 != 0 || V % 64 != 0 ||
      (V / w.gs) % 8 != 0 || V > 4 * NT * kNV || sh.Dv > 128 || (sh.Dv & (sh.Dv - 1)) != 0 || sh.Dv < 4 ||
      w.out >= (int64_t(1) << 31) || barrier == nullptr)
    return false;
  if (!aligned16(w.w) || !aligned16(w.s) || !aligned16(w.b) || !aligned16(y) || !aligned16(z) || !aligned16(norm_w))
    return false;
  if (!device_sm90()) return false;
  const int K = static_cast<int>(V), G = static_cast<int>(V / w.gs), KB = tc_blocks(K);
  const dim3 grid(sh.Hv, sh.Dv / gdn_detail::kCols);
  const int nblk = static_cast<int>(grid.x * grid.y);
  OutArgs o{w, z, norm_w, sh.eps, out, static_cast<int>((w.out + 15) / 16), 0, barrier};
  o.tpb = (o.tiles + nblk - 1) / nblk;
  if (o.tpb > kMaxTiles) return false;
  const size_t smem = kBarBytes + size_t(o.tpb) * tile_bytes(K, G) + size_t(tc_smem_bytes(K)) +
                      size_t(o.tpb) * KB * 16 * 4;
  if (smem > kMaxSmem) return false;
  const size_t smem_launch = one_per_sm() ? std::max(smem, size_t(120 * 1024)) : smem;
  const bool wide = sh.kernel > 4;
  if (nblk > (wide ? resident_blocks<gdn_detail::kMaxKS>(c, smem_launch) : resident_blocks<4>(c, smem_launch)))
    return false;
  const int early = early_state ? 1 : 0;
  if (wide)
    launch(c, "gdn_out_kernel", gdn_out_kernel<gdn_detail::kMaxKS>, grid, NT, smem_launch, sh, mixed, b, a, conv_w, A_log,
           dt_bias, conv_state, state, y, c.counters, early, o);
  else
    launch(c, "gdn_out_kernel", gdn_out_kernel<4>, grid, NT, smem_launch, sh, mixed, b, a, conv_w, A_log, dt_bias,
           conv_state, state, y, c.counters, early, o);
  FERN_CUDA_LAUNCH_CHECK("gdn_out_kernel");
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace fern::cuda
