// lm_head's decode GEMV (one token row, 4-bit in groups of 64) with its weights streamed through a shared-memory
// ring by bulk copies instead of register loads. Opt-in (FERN_CUDA_HEAD_RING, linear.cu): two forms measured slower
// than the register-load kernel, this one (one copy per tile) not yet run on a GPU; see
// docs/notes/cuda-decode-v37-head-ring.md. Why it was written: the register-load tensor-core GEMV (linear.cu
// linear_tc_kernel) streams lm_head's 286 MB at ~3.0 TB/s (95 us per step), and versions 21, 23 and 25 found it bound
// neither by its sector traffic, its load instructions nor its balance, while a bulk-copy stream of whole contiguous
// regions measured 4.48 TB/s on this GPU (bench_cuda_persistent, one phase). The arithmetic is linear_tc_kernel's
// (gemv_tc.cuh tc_item on the same staged table of x; a tile's K blocks added in order as that kernel's split form
// does, so where its warps share tiles the two give the same bits).
//
// One block per SM: one producer warp and kConsumerWarps consumer warps. The block owns a contiguous range of
// 16-row tiles; the producer requests tile i into stage i % stages (its codes, its scales, its biases: three bulk
// copies) once every consumer warp has released the stage, from before the PDL wait (the weights do not depend on
// the previous kernel). The consumer warps stage x into the table after the wait, then take every tile together
// (below). The rows lie 1,024 bytes apart as in memory, so a warp's 16-byte fragment reads take 8 shared-memory
// wavefronts instead of 4 (lanes g = 0..7 of one j hit the same banks); rows padded by 16 bytes avoid that but
// need a copy per row, which measured slower (the notes).
#include "cuda/linear_ring.h"

#include <cstdint>

#include "core/env.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_util.cuh"
#include "cuda/gemv_tc.cuh"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kRingThreads = 32 * (kConsumerWarps + 1);
constexpr int kMaxStages = 12;  // 11 fit at K = 2,048 (~200 KB of tiles per SM in flight)

// A stage: the tile's 16 rows of codes as they lie in memory (K / 2 bytes each), then its scales [16][K / 64] and
// biases (bf16), each block a multiple of 16 bytes (K % 512 == 0).
__host__ __device__ constexpr int ring_sb_bytes(int K) { return 16 * (K / 64) * 2; }
__host__ __device__ constexpr int ring_stage_bytes(int K) { return 16 * (K / 2) + 2 * ring_sb_bytes(K); }
constexpr size_t ring_smem_bytes(int K, int stages) {
  return size_t(stages) * ring_stage_bytes(K) + tc_smem_bytes(K) + 2 * sizeof(uint64_t) * stages +
         2 * kConsumerWarps * 16 * sizeof(float);
}

__global__ void __launch_bounds__(kRingThreads, 1)
    linear_ring_kernel(QW A, const float* x, float* y, int rows, int tpb, int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const int K = static_cast<int>(A.in), gpr = K / 64, rb = K / 2;
  const int sbb = ring_sb_bytes(K), stage_bytes = ring_stage_bytes(K);
  const int tiles = (rows + 15) / 16;
  const int t0 = blockIdx.x * tpb, nt = min(tpb, tiles - t0);
  unsigned char* ring = smem;
  uint4* xb = reinterpret_cast<uint4*>(smem + size_t(stages) * stage_bytes);
  float* xg = reinterpret_cast<float*>(xb + tc_table_uint4s(K));
  uint64_t* full = reinterpret_cast<uint64_t*>(xg + tc_blocks(K) * 4);
  uint64_t* empty = full + stages;
  float* red = reinterpret_cast<float*>(empty + stages);  // [2][kConsumerWarps][16] partial row sums
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], kConsumerWarps);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer
    const char* wsrc = static_cast<const char*>(A.w);
    const char* ssrc = reinterpret_cast<const char*>(A.s);
    const char* bsrc = reinterpret_cast<const char*>(A.b);
    int s = 0;
    uint32_t phase = 0;
    for (int i = 0; i < nt; ++i) {
      const int64_t r0 = int64_t(t0 + i) * 16;
      const int nr = min(16, rows - static_cast<int>(r0));
      if (lane == 0) {
        ptx::mbar_wait(&empty[s], phase ^ 1);
        ptx::mbar_arrive_expect_tx(&full[s], uint32_t(nr) * (rb + 2 * 2 * gpr));  // codes, scales, biases
      }
      __syncwarp();
      unsigned char* st = ring + size_t(s) * stage_bytes;
      if (lane < 3) {  // the tile's codes (fewer rows: fewer bytes), its scales, its biases
        const int64_t off = lane == 0 ? r0 * rb : r0 * gpr * 2;
        const char* src = (lane == 0 ? wsrc : lane == 1 ? ssrc : bsrc) + off;
        unsigned char* dst = st + (lane == 0 ? 0 : 16 * rb + (lane - 1) * sbb);
        ptx::bulk_copy_g2s(dst, src, uint32_t(nr) * (lane == 0 ? rb : gpr * 2), &full[s]);
      }
      if (++s == stages) {
        s = 0;
        phase ^= 1;
      }
    }
    return;
  }

  // The consumers: x into the tensor cores' B table (the 256 consumer threads, as linear_tc_kernel's stage_rows).
  pdl_wait();
  const TcSink sink{xb, xg};
  for (int f0 = warp * 32; f0 < K / 4; f0 += kConsumerWarps * 32) {
    const int f = f0 + lane;
    sink(f, true, __ldcg(reinterpret_cast<const float4*>(x) + f));
  }
  ptx::bar_sync(1, kConsumerWarps * 32);
  pdl_trigger();

  // Every warp takes K blocks warp, warp + kConsumerWarps, ... of every tile, so that a stage is consumed in a
  // fraction of the time one warp would need for the whole tile and is back in flight sooner. The warps' partial row
  // sums go to red (two slots by tile parity), one named barrier per tile, then the tile's owner warp adds them in K
  // order and writes its 16 rows. Slot reuse is safe: tile i + 2's writes come after barrier i + 1, which the owner
  // of tile i reaches only once it has read slot i & 1.
  const int g = lane >> 2, j = lane & 3;
  const int bq = (g >> 1) == j ? g : -1;
  const int KB = K / kTcK, parts = min(KB, kConsumerWarps);
  int s = 0;
  uint32_t phase = 0;
  for (int i = 0; i < nt; ++i) {
    ptx::mbar_wait(&full[s], phase);
    const unsigned char* st = ring + size_t(s) * stage_bytes;
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + 16 * rb);
    const uint16_t* bi = sc + sbb / 2;
    float acc[2] = {0.0f, 0.0f};
    for (int kb = warp; kb < KB; kb += kConsumerWarps) {
      TcItem it;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = g + 8 * r;
        const uint4* p = reinterpret_cast<const uint4*>(st + row * rb) + kb * 8 + 2 * j;
        it.w[2 * r] = p[0];
        it.w[2 * r + 1] = p[1];
        it.s[r] = bf16_to_f32(sc[row * gpr + kb * 4 + j]);
        it.b[r] = bf16_to_f32(bi[row * gpr + kb * 4 + j]);
      }
      tc_item(it, xb, xg, kb, j, bq, acc);
    }
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(&empty[s]);
    if (++s == stages) {
      s = 0;
      phase ^= 1;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
    }
    float* slot = red + (i & 1) * kConsumerWarps * 16;
    if (j < 2) slot[warp * 16 + g + 8 * j] = j == 0 ? acc[0] : acc[1];  // lane j = 0: row g, j = 1: row g + 8
    ptx::bar_sync(2, kConsumerWarps * 32);
    if (warp == i % kConsumerWarps && lane < 16) {
      float v = 0.0f;
      for (int w = 0; w < parts; ++w) v += slot[w * 16 + lane];
      const int row = (t0 + i) * 16 + lane;
      if (row < rows) y[row] = v;
    }
  }
#else
  __trap();  // linear_ring_ok refuses devices below sm_90
#endif
}

// The current device's compute capability (major) and per-block shared-memory limit (opt-in).
struct RingDevice {
  int major = 0, optin = 0;
};
RingDevice ring_device() {
  RingDevice d;
  int dev = 0;
  FERN_CUDA_CHECK(cudaGetDevice(&dev));
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return d;
}

// Stages that fit the device's per-block shared memory for width K (0: the device cannot run the kernel).
int ring_stages(const RingDevice& d, int K) {
  if (d.major < 9) return 0;
  int stages = kMaxStages;
  while (stages >= 3 && ring_smem_bytes(K, stages) > size_t(d.optin)) --stages;
  return stages >= 3 ? stages : 0;
}

}  // namespace

bool linear_ring_ok(const Ctx&, const QW& w) {
  if (w.bits != 4 || w.gs != 64 || w.in % 512 != 0 || w.in > 4096 || w.out < 1 || w.out > (int64_t(1) << 30))
    return false;
  if (!aligned16(w.w) || !aligned16(w.s) || !aligned16(w.b)) return false;
  return ring_stages(ring_device(), static_cast<int>(w.in)) > 0;
}

void linear_ring(const Ctx& c, const QW& w, const float* x, float* y) {
  const int K = static_cast<int>(w.in), rows = static_cast<int>(w.out);
  const RingDevice d = ring_device();
  int stages = ring_stages(d, K);
  // FERN_CUDA_HEAD_RING_STAGES=N: at most N stages (read at every call, for comparisons: how deep the ring must be).
  stages = static_cast<int>(env_int("FERN_CUDA_HEAD_RING_STAGES", 1, stages, stages));
  FERN_CU_CHECK(stages > 0 && linear_ring_ok(c, w), "linear_ring: weights or device not supported");
  const int tiles = (rows + 15) / 16;
  const int tpb = (tiles + c.sms - 1) / c.sms;
  const int blocks = (tiles + tpb - 1) / tpb;
  const size_t smem = ring_smem_bytes(K, stages);
  allow_dynamic_smem<linear_ring_kernel>(size_t(d.optin));  // every width's ring fits under it (ring_stages)
  launch(c, "linear_ring_kernel", linear_ring_kernel, dim3(blocks), dim3(kRingThreads), smem, w, x, y, rows, tpb,
         stages);
}

}  // namespace fern::cuda
