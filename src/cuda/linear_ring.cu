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
// 16-row tiles; the producer requests them stage by stage (a stage: one or two tiles' codes, scales and biases, by
// default three bulk copies; RingForm) once every consumer warp has released the stage, from before the PDL wait (the
// weights do not depend on the previous kernel). The consumer warps stage x into the table after the wait, then take
// every tile together (below). In the default form the rows lie 1,024 bytes apart as in memory, so a warp's
// 16-byte fragment reads take 8 shared-memory wavefronts instead of 4 (lanes g = 0..7 of one j hit the same banks);
// rows padded by 16 bytes avoid that but need a copy per row (FERN_CUDA_HEAD_RING_COPY=rows), which measured slower.
#include "cuda/linear_ring.h"

#include <algorithm>
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
constexpr int kMaxStages = 12;  // 11 one-tile stages fit at K = 2,048 (~200 KB per SM in flight)

// How a stage is filled (for comparisons, read at every call): FERN_CUDA_HEAD_RING_COPY=tile (the default: the
// stage's codes as one bulk copy, rows as they lie in memory) or rows (one copy per row into rows padded by 16
// bytes: conflict-free fragment reads, but 16 copies per tile, the form measured slower); FERN_CUDA_HEAD_RING_TILES=
// 1 (the default) or 2 tiles per stage (copies twice as large, half as many stages).
struct RingForm {
  int row_copies = 0;  // 0 or 1
  int tps = 1;         // tiles per stage
  __host__ __device__ int pitch(int K) const { return K / 2 + (row_copies ? 16 : 0); }
  __host__ __device__ int stage_rows() const { return 16 * tps; }
  // A stage: stage_rows() rows of codes at pitch(K), then their scales [rows][K / 64] and biases (bf16), each block
  // a multiple of 16 bytes (K % 512 == 0).
  __host__ __device__ int sb_bytes(int K) const { return stage_rows() * (K / 64) * 2; }
  __host__ __device__ int stage_bytes(int K) const { return stage_rows() * pitch(K) + 2 * sb_bytes(K); }
  size_t smem_bytes(int K, int stages) const {
    return size_t(stages) * stage_bytes(K) + tc_smem_bytes(K) + 2 * sizeof(uint64_t) * stages +
           2 * kConsumerWarps * 16 * sizeof(float);
  }
};

RingForm ring_form() {
  RingForm f;
  f.row_copies = env_choice("FERN_CUDA_HEAD_RING_COPY", {"tile", "rows"}, 0);
  f.tps = env_choice("FERN_CUDA_HEAD_RING_TILES", {"1", "2"}, 0) + 1;
  return f;
}

__global__ void __launch_bounds__(kRingThreads, 1)
    linear_ring_kernel(QW A, const float* x, float* y, int rows, int tpb, int stages, RingForm form) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const int K = static_cast<int>(A.in), gpr = K / 64, rb = K / 2;
  const int pitch = form.pitch(K), SR = form.stage_rows(), tps = form.tps;
  const int sbb = form.sb_bytes(K), stage_bytes = form.stage_bytes(K);
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

  if (warp == kConsumerWarps) {  // the producer: stage q holds the block's tiles q tps .. q tps + tps - 1
    const char* wsrc = static_cast<const char*>(A.w);
    const char* ssrc = reinterpret_cast<const char*>(A.s);
    const char* bsrc = reinterpret_cast<const char*>(A.b);
    int s = 0;
    uint32_t phase = 0;
    for (int i = 0; i < nt; i += tps) {
      const int64_t r0 = int64_t(t0 + i) * 16;
      const int nr = min(min(tps, nt - i) * 16, rows - static_cast<int>(r0));  // this block's rows only
      if (lane == 0) {
        ptx::mbar_wait(&empty[s], phase ^ 1);
        ptx::mbar_arrive_expect_tx(&full[s], uint32_t(nr) * (rb + 2 * 2 * gpr));  // codes, scales, biases
      }
      __syncwarp();
      unsigned char* st = ring + size_t(s) * stage_bytes;
      if (form.row_copies) {
        for (int r = lane; r < nr; r += 32) ptx::bulk_copy_g2s(st + r * pitch, wsrc + (r0 + r) * rb, rb, &full[s]);
      } else if (lane == 0) {
        ptx::bulk_copy_g2s(st, wsrc + r0 * rb, uint32_t(nr) * rb, &full[s]);
      }
      if (lane == 1 || lane == 2) {  // the rows' scales, their biases
        const char* src = (lane == 1 ? ssrc : bsrc) + r0 * gpr * 2;
        ptx::bulk_copy_g2s(st + SR * pitch + (lane - 1) * sbb, src, uint32_t(nr) * gpr * 2, &full[s]);
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
  // fraction of the time one warp would need for the whole tile and is back in flight sooner (measured: one warp per
  // tile was no faster, notes v37). The warps' partial row sums go to red (two slots by tile parity), one named
  // barrier per tile, then the tile's owner warp adds them in K order and writes its 16 rows. Slot reuse is safe:
  // tile i + 2's writes come after barrier i + 1, which the owner of tile i reaches only once it has read slot i & 1.
  const int g = lane >> 2, j = lane & 3;
  const int bq = (g >> 1) == j ? g : -1;
  const int KB = K / kTcK, parts = min(KB, kConsumerWarps);
  int s = 0;
  uint32_t phase = 0;
  for (int i = 0; i < nt; ++i) {
    const int u = i % tps;  // the tile's place in its stage
    if (u == 0) ptx::mbar_wait(&full[s], phase);
    const unsigned char* st = ring + size_t(s) * stage_bytes;
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + SR * pitch);
    const uint16_t* bi = sc + sbb / 2;
    float acc[2] = {0.0f, 0.0f};
    for (int kb = warp; kb < KB; kb += kConsumerWarps) {
      TcItem it;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * u + g + 8 * r;
        const uint4* p = reinterpret_cast<const uint4*>(st + row * pitch) + kb * 8 + 2 * j;
        it.w[2 * r] = p[0];
        it.w[2 * r + 1] = p[1];
        it.s[r] = bf16_to_f32(sc[row * gpr + kb * 4 + j]);
        it.b[r] = bf16_to_f32(bi[row * gpr + kb * 4 + j]);
      }
      tc_item(it, xb, xg, kb, j, bq, acc);
    }
    if (u == tps - 1 || i == nt - 1) {  // the stage's last tile: release it
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[s]);
      if (++s == stages) {
        s = 0;
        phase ^= 1;
      }
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

// Stages of the form that fit the device's per-block shared memory for width K (0: the device cannot run it).
int ring_stages(const RingDevice& d, const RingForm& f, int K) {
  if (d.major < 9) return 0;
  int stages = kMaxStages;
  while (stages >= 3 && f.smem_bytes(K, stages) > size_t(d.optin)) --stages;
  return stages >= 3 ? stages : 0;
}

// The weights' part of linear_ring_ok (the rest is the device's and the form's: ring_stages).
bool ring_weights_ok(const QW& w) {
  return w.bits == 4 && w.gs == 64 && w.in % 512 == 0 && w.in <= 4096 && w.out >= 1 && w.out <= (int64_t(1) << 30) &&
         aligned16(w.w) && aligned16(w.s) && aligned16(w.b);
}

}  // namespace

bool linear_ring_ok(const Ctx&, const QW& w) {
  return ring_weights_ok(w) && ring_stages(ring_device(), ring_form(), static_cast<int>(w.in)) > 0;
}

void linear_ring(const Ctx& c, const QW& w, const float* x, float* y) {
  const int K = static_cast<int>(w.in), rows = static_cast<int>(w.out);
  const RingDevice d = ring_device();
  const RingForm form = ring_form();
  int stages = ring_stages(d, form, K);
  FERN_CU_CHECK(stages > 0 && ring_weights_ok(w), "linear_ring: weights or device not supported");
  // FERN_CUDA_HEAD_RING_STAGES=N: at most N stages (read at every call, for comparisons: how deep the ring must be).
  stages = std::min(stages, static_cast<int>(env_int("FERN_CUDA_HEAD_RING_STAGES", 1, kMaxStages, stages)));
  const int tiles = (rows + 15) / 16;
  const int tpb = (tiles + c.sms - 1) / c.sms;
  const int blocks = (tiles + tpb - 1) / tpb;
  allow_dynamic_smem<linear_ring_kernel>(size_t(d.optin));  // every form's ring fits under it (ring_stages)
  launch(c, "linear_ring_kernel", linear_ring_kernel, dim3(blocks), dim3(kRingThreads), form.smem_bytes(K, stages),
         w, x, y, rows, tpb, stages, form);
}

}  // namespace fern::cuda
