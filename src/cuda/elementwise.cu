// Row-wise and element-wise kernels: embedding gather (dequantises one row), RMSNorm, residual add + RMSNorm,
// add, argmax over the vocabulary, and the device-side position counter.
// Inputs written by an earlier kernel are plain `const T*`, never `const T* __restrict__`: under PDL that kernel
// may still be running while this one is resident, and const + restrict would allow the non-coherent load path
// and its scheduling ahead of griddepcontrol.wait (qdot.cuh stage_x, docs/notes/cuda-decode-v6.md). Weights
// and the position counter (written only by advance_kernel, the last launch of a step) may stay restrict.
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/qdot.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) embed_kernel(QW W, const int32_t* ids,
                                                         float* __restrict__ out) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  int64_t id = ids[t];
  // Out-of-range ids are clamped (the tokenizer and the server validate ids; this only keeps reads in bounds).
  id = id < 0 ? 0 : (id >= W.out ? W.out - 1 : id);
  float* o = out + int64_t(t) * W.in;
  if (W.bits == 16) {
    const uint16_t* row = static_cast<const uint16_t*>(W.w) + id * W.in;
    for (int64_t k = threadIdx.x; k < W.in; k += blockDim.x) o[k] = bf16_to_f32(row[k]);
  } else {
    // 4- or 8-bit codes in groups of a power of two that holds whole words (make_qw): a word per thread and
    // iteration, its codes in one group, the real table's 2048-wide row one iteration of three loads in flight
    // together (a load loop per code waited for eight dependent rounds from a row that is never in L2: ~8 us per
    // decode step, docs/notes/cuda-decode-v11-timeline.md). Shifts instead of the divisions by the group size and
    // codes per word, which sat between the id's arrival and the row's loads (docs/notes/cuda-decode-v23-probes.md).
    const int lper = W.bits == 4 ? 3 : 2, per = 1 << lper;  // codes per word
    const int gsh = 31 - __clz(W.gs);
    const int wpr = static_cast<int>(W.in >> lper);  // words per row
    const uint32_t mask = (1u << W.bits) - 1u;
    const uint32_t* row = static_cast<const uint32_t*>(W.w) + id * wpr;
    const int64_t g0 = id * (W.in >> gsh);
    for (int wi = threadIdx.x; wi < wpr; wi += blockDim.x) {
      const uint32_t word = row[wi];
      const int k0 = wi << lper;
      const int64_t g = g0 + (k0 >> gsh);
      const float s = bf16_to_f32(W.s[g]), b = bf16_to_f32(W.b[g]);
      for (int j = 0; j < per; ++j) o[k0 + j] = s * float((word >> (j * W.bits)) & mask) + b;
    }
  }
}

// One block per row; `resid` (optional) receives resid + delta first.
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(float* __restrict__ out, const float* x, float* resid,
                                                           const float* delta,
                                                           const float* __restrict__ w, int D, float eps) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  float ss = 0.0f;
  if (resid) {
    float* rr = resid + r * D;
    const float* dr = delta + r * D;
    for (int k = threadIdx.x; k < D; k += blockDim.x) {
      const float v = rr[k] + dr[k];
      rr[k] = v;
      ss += v * v;
    }
    xr = rr;
  } else {
    for (int k = threadIdx.x; k < D; k += blockDim.x) ss += xr[k] * xr[k];
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(D) + eps);
  float* o = out + r * D;
  for (int k = threadIdx.x; k < D; k += blockDim.x) o[k] = xr[k] * inv * w[k];
}

// The same with the row in registers (D a multiple of 4, at most 4 * kThreads * VPT): the norm weights are
// requested before waiting on the previous kernel, and the row is read once (v1 re-read it, and the weights, after
// the reduction: two dependent memory round trips per norm, ~3.5 us each at D = 2048).
template <int VPT>
__global__ void __launch_bounds__(kThreads) rmsnorm_vec_kernel(float* __restrict__ out, const float* x, float* resid,
                                                               const float* delta,
                                                               const float* __restrict__ w, int D, float eps) {
  __shared__ float red[32];
  const int n4 = D / 4;
  const int64_t r = blockIdx.x;
  float4 wv[VPT], xv[VPT];
  norm_weights_load<VPT, kThreads>(w, D, wv);
  pdl_wait();
  pdl_trigger();
  const float inv = norm_row_load<VPT, kThreads>(x, resid, delta, r, D, eps, xv, red);
  float4* o = reinterpret_cast<float4*>(out + r * D);
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int i = threadIdx.x + v * kThreads;
    if (i < n4) o[i] = norm_apply(xv[v], inv, wv[v]);
  }
}

// Launches the register version when the shape and alignment allow it, else the generic kernel.
void launch_norm(const Ctx& c, float* out, const float* x, float* resid, const float* delta, const float* w, int rows,
                 int D, float eps) {
  auto al = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = D % 4 == 0 && al(out) && al(x) && al(resid) && al(delta) && al(w);
  const int n4 = D / 4;
  if (vec && n4 <= kThreads) {
    launch(c, "rmsnorm_vec_kernel", rmsnorm_vec_kernel<1>, rows, kThreads, 0, out, x, resid, delta, w, D, eps);
  } else if (vec && n4 <= 2 * kThreads) {
    launch(c, "rmsnorm_vec_kernel", rmsnorm_vec_kernel<2>, rows, kThreads, 0, out, x, resid, delta, w, D, eps);
  } else if (vec && n4 <= 4 * kThreads) {
    launch(c, "rmsnorm_vec_kernel", rmsnorm_vec_kernel<4>, rows, kThreads, 0, out, x, resid, delta, w, D, eps);
  } else {
    launch(c, "rmsnorm_kernel", rmsnorm_kernel, rows, kThreads, 0, out, x, resid, delta, w, D, eps);
  }
}

__global__ void add_kernel(float* __restrict__ out, const float* a, const float* b, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

// Argmax over V for each of T rows: grid (B, T); each block reduces a slice to (value, index) pairs, and the last
// block of a row to finish (a counter per row, reset by that block) reduces the B pairs and writes the id.
constexpr int kArgmaxBlocks = 128;
constexpr int kArgmaxBatch = 8;

__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  // NaN never wins; ties go to the lowest index.
  if (ov > v || (ov == v && oi < i) || (v != v && ov == ov)) {
    v = ov;
    i = oi;
  }
}

__device__ __forceinline__ void block_argmax(float& v, int& i) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    better(v, i, ov, oi);
  }
  __syncthreads();
  if (lane == 0) {
    sv[wid] = v;
    si[wid] = i;
  }
  __syncthreads();
  v = lane < nw ? sv[lane] : -INFINITY;
  i = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    better(v, i, ov, oi);
  }
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(int32_t* __restrict__ ids, const float* logits,
                                                          int64_t V, float* part_v, int* part_i, int* counters) {
  pdl_wait();
  pdl_trigger();
  __shared__ bool last;
  const int t = blockIdx.y;
  const float* l = logits + int64_t(t) * V;
  const int64_t per = (V + gridDim.x - 1) / gridDim.x;
  const int64_t lo = blockIdx.x * per, hi = min(V, lo + per);
  float v = -INFINITY;
  int i = 0x7fffffff;
  // kArgmaxBatch loads in flight per thread before any comparison (one batch covers the real vocabulary's
  // 1,940 logits per block): a load-compare loop waited for one L2 round trip per element it read.
  for (int64_t j0 = lo + threadIdx.x; j0 < hi; j0 += int64_t(kArgmaxBatch) * blockDim.x) {
    float x[kArgmaxBatch];
#pragma unroll
    for (int u = 0; u < kArgmaxBatch; ++u) {
      const int64_t j = j0 + int64_t(u) * blockDim.x;
      x[u] = j < hi ? l[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kArgmaxBatch; ++u) {
      const int64_t j = j0 + int64_t(u) * blockDim.x;
      if (j < hi) better(v, i, x[u], static_cast<int>(j));
    }
  }
  block_argmax(v, i);
  if (threadIdx.x == 0) {
    part_v[t * gridDim.x + blockIdx.x] = v;
    part_i[t * gridDim.x + blockIdx.x] = i;
    __threadfence();
    last = atomicAdd(&counters[t], 1) == int(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  v = -INFINITY;
  i = 0x7fffffff;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x)
    better(v, i, __ldcg(part_v + t * gridDim.x + b), __ldcg(part_i + t * gridDim.x + b));
  block_argmax(v, i);
  if (threadIdx.x == 0) {
    ids[t] = i == 0x7fffffff ? 0 : i;
    counters[t] = 0;
  }
}

__global__ void advance_kernel(int32_t* d_pos, int n) {
  pdl_wait();
  pdl_trigger();
  d_pos[0] += n;
}

}  // namespace

void embed(const Ctx& c, const QW& table, const int32_t* ids, float* out, int T) {
  if (T <= 0) return;
  launch(c, "embed_kernel", embed_kernel, T, kThreads, 0, table, ids, out);
  FERN_CUDA_LAUNCH_CHECK("embed_kernel");
}

void rmsnorm(const Ctx& c, float* out, const float* x, const float* w, int rows, int D, float eps) {
  if (rows <= 0) return;
  launch_norm(c, out, x, nullptr, nullptr, w, rows, D, eps);
  FERN_CUDA_LAUNCH_CHECK("rmsnorm_kernel");
}

void add_rmsnorm(const Ctx& c, float* resid, const float* delta, float* out, const float* w, int rows, int D,
                 float eps) {
  if (rows <= 0) return;
  launch_norm(c, out, resid, resid, delta, w, rows, D, eps);
  FERN_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
}

void add(const Ctx& c, float* out, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(c.sms) * 8));
  launch(c, "add_kernel", add_kernel, blocks, kThreads, 0, out, a, b, n);
  FERN_CUDA_LAUNCH_CHECK("add_kernel");
}

size_t argmax_scratch_bytes(int T) { return size_t(T) * kArgmaxBlocks * 8; }

void argmax(const Ctx& c, int32_t* ids, const float* logits, int T, int64_t V, void* scratch) {
  if (T <= 0) return;
  float* pv = static_cast<float*>(scratch);
  int* pi = reinterpret_cast<int*>(pv + size_t(T) * kArgmaxBlocks);
  const int blocks = static_cast<int>(std::min<int64_t>(kArgmaxBlocks, (V + kThreads - 1) / kThreads));
  launch(c, "argmax_kernel", argmax_kernel, dim3(blocks, T), kThreads, 0, ids, logits, V, pv, pi, c.counters);
  FERN_CUDA_LAUNCH_CHECK("argmax_kernel");
}

void advance_pos(const Ctx& c, int32_t* d_pos, int n) {
  launch(c, "advance_kernel", advance_kernel, 1, 1, 0, d_pos, n);
  FERN_CUDA_LAUNCH_CHECK("advance_kernel");
}

}  // namespace fern::cuda
