// Device token pick (pick.h): the host Sampler's rule (Sampler::sample_at) for one uniform draw, in three launches.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <cfloat>
#include <climits>

#include "cuda/cuda_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/pick.h"

namespace fern::cuda {
namespace {

constexpr int kPrepThreads = 256;
constexpr int kPrepItems = kPickChunk / kPrepThreads;  // 8
constexpr int kFinalThreads = 1024;
constexpr int kFinalItems = kPickSortSlots / kFinalThreads;  // 8
constexpr int kC = kPickMaxTopK;                              // stride of a block's candidate list

using PrepSort = cub::BlockRadixSort<unsigned long long, kPrepThreads, kPrepItems>;
using FinalSort = cub::BlockRadixSort<unsigned long long, kFinalThreads, kFinalItems>;
using FinalScan = cub::BlockScan<double, kFinalThreads>;

// The host's order_key (engine/logit_scan.h): a larger float has a larger key.
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ unsigned long long make_key(float v, int64_t i) {
  return (static_cast<unsigned long long>(order_key(v)) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}
__device__ __forceinline__ float key_value(unsigned long long k) {
  const uint32_t o = static_cast<uint32_t>(k >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ int key_index(unsigned long long k) {
  return static_cast<int>(~static_cast<uint32_t>(k));
}

// Maximum over the block (every thread gets it). `red` holds one entry per warp.
template <int THREADS>
__device__ __forceinline__ unsigned long long block_max(unsigned long long x, unsigned long long* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long y = __shfl_xor_sync(0xffffffffu, x, o);
    x = y > x ? y : x;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  x = 0;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) x = red[w] > x ? red[w] : x;
  return x;
}

template <int THREADS>
__device__ __forceinline__ double block_sum(double x, double* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  x = 0;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) x += red[w];
  return x;
}

__device__ __forceinline__ bool wants_candidates(const PickDevice& p) {
  return p.temperature > 0.0f && (p.top_k > 0 || p.top_p < 1.0f);
}
__device__ __forceinline__ int candidates_per_block(const PickDevice& p) { return p.top_k > 0 ? p.top_k : kC; }
// The weights' floor: min-p over the whole vocabulary (Sampler::sample_at's first branch), else none.
__device__ __forceinline__ float weight_floor(const PickDevice& p, float mx) {
  return p.top_k == 0 && p.top_p >= 1.0f && p.min_p > 0.0f ? mx + p.log_min_p : -INFINITY;
}
__device__ __forceinline__ float weight(float v, float mx, float floor) { return v >= floor ? expf(v - mx) : 0.0f; }

// The best key of all blocks (each block's list starts with its best).
template <int THREADS>
__device__ __forceinline__ unsigned long long top_key(const uint64_t* cand, int nb, unsigned long long* red) {
  unsigned long long m = 0;
  for (int b = threadIdx.x; b < nb; b += THREADS) {
    const unsigned long long k = __ldcg(reinterpret_cast<const unsigned long long*>(cand) + size_t(b) * kC);
    m = k > m ? k : m;
  }
  return block_max<THREADS>(m, red);
}

// Launch 1: bias, temperature, the block's best key(s).
__global__ void __launch_bounds__(kPrepThreads) pick_prep_kernel(const float* logits, int64_t V, PickBuffers b,
                                                                  const int32_t* ids) {
  pdl_wait();
  pdl_trigger();
  const PickDevice p = *b.params;
  if (!p.enabled) return;
  __shared__ union {
    typename PrepSort::TempStorage sort;
    float vals[kPickChunk];
  } sm;
  __shared__ unsigned long long red[kPrepThreads / 32];
  const int64_t base = int64_t(blockIdx.x) * kPickChunk;
  const int n = static_cast<int>(V - base < kPickChunk ? V - base : kPickChunk);
  for (int i = threadIdx.x; i < n; i += kPrepThreads) sm.vals[i] = logits[base + i];
  __syncthreads();
  for (int j = threadIdx.x; j < p.n_bias; j += kPrepThreads) {
    const int64_t t = b.bias_tok[j];
    if (t >= base && t < base + n) atomicAdd(&sm.vals[t - base], b.bias_val[j]);
  }
  if (p.penalties) {  // the token this step was fed counts from this pick on (Sampler::accept before the next pick)
    const int64_t fed = *ids;
    if (threadIdx.x == 0 && fed >= base && fed < base + n) {
      b.counts[fed] += 1;
      b.seen[fed] = 1;
    }
  }
  __syncthreads();
  const bool scale = p.temperature > 0.0f;
  unsigned long long keys[kPrepItems];
  bool nan = false;
#pragma unroll
  for (int k = 0; k < kPrepItems; ++k) {
    const int i = threadIdx.x * kPrepItems + k;  // blocked, as the sort wants its items
    keys[k] = 0;
    if (i < n) {
      float x = sm.vals[i];
      if (p.penalties) {  // Sampler::apply_penalties after the bias, in its order and roundings (no contraction)
        if (p.repetition != 1.0f && b.seen[base + i])
          x = x > 0.0f ? __fdiv_rn(x, p.repetition) : __fmul_rn(x, p.repetition);
        const int cnt = b.counts[base + i];
        if (cnt > 0) x = __fsub_rn(x, __fadd_rn(p.presence, __fmul_rn(p.frequency, float(cnt))));
      }
      if (x != x) {
        nan = true;
      } else {
        if (scale) x *= p.inv_t;
        keys[k] = make_key(x, base + i);
      }
      b.v[base + i] = x;
    }
  }
  if (__syncthreads_or(nan) && threadIdx.x == 0) atomicOr(b.flags, 1);
  unsigned long long* out = reinterpret_cast<unsigned long long*>(b.cand) + size_t(blockIdx.x) * kC;
  if (!wants_candidates(p)) {
    unsigned long long m = 0;
#pragma unroll
    for (int k = 0; k < kPrepItems; ++k) m = keys[k] > m ? keys[k] : m;
    m = block_max<kPrepThreads>(m, red);
    if (threadIdx.x == 0) out[0] = m;
    return;
  }
  PrepSort(sm.sort).SortDescending(keys);  // after __syncthreads_or: nobody reads vals any more
  const int c = candidates_per_block(p);
#pragma unroll
  for (int k = 0; k < kPrepItems; ++k) {
    const int r = threadIdx.x * kPrepItems + k;
    if (r < c) out[r] = keys[k];
  }
}

// Launch 2: the block's sum of weights, where the draw spans the whole vocabulary (or top-p needs its total).
__global__ void __launch_bounds__(kPrepThreads) pick_sums_kernel(int64_t V, PickBuffers b) {
  pdl_wait();
  pdl_trigger();
  const PickDevice p = *b.params;
  if (!p.enabled || p.temperature <= 0.0f || p.top_k > 0) return;
  if (__ldcg(b.flags)) return;
  __shared__ unsigned long long red[kPrepThreads / 32];
  __shared__ double dred[kPrepThreads / 32];
  const float mx = key_value(top_key<kPrepThreads>(b.cand, gridDim.x, red));
  if (!isfinite(mx)) return;
  const float floor = weight_floor(p, mx);
  const int64_t base = int64_t(blockIdx.x) * kPickChunk;
  const int n = static_cast<int>(V - base < kPickChunk ? V - base : kPickChunk);
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += kPrepThreads) s += weight(__ldcg(b.v + base + i), mx, floor);
  const double total = block_sum<kPrepThreads>(double(s), dred);
  if (threadIdx.x == 0) b.bsum[blockIdx.x] = total;
}

struct Pick {
  int token;
  int status;
};

// Temperature (and min-p) over the whole vocabulary: the block where the cumulative weight passes u * total, then
// the token inside it, as the host walks its weight blocks.
__device__ Pick pick_whole(const PickDevice& p, int64_t V, const PickBuffers& b, int nb, float mx, int top, double u) {
  __shared__ int s_block, s_first, s_last;
  __shared__ double s_r;
  if (threadIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < nb; ++i) total += __ldcg(b.bsum + i);
    double r = u * total;
    int blk = 0;
    while (blk < nb && r >= __ldcg(b.bsum + blk)) r -= __ldcg(b.bsum + blk++);
    if (blk >= nb) {  // rounding kept r out of reach: the last block with weight, and its last weighted token
      blk = nb - 1;
      while (blk > 0 && __ldcg(b.bsum + blk) <= 0.0) --blk;
      r = DBL_MAX;
    }
    s_block = blk;
    s_r = r;
    s_first = INT_MAX;
    s_last = -1;
  }
  __syncthreads();
  const float floor = weight_floor(p, mx);
  const int64_t base = int64_t(s_block) * kPickChunk;
  const int n = static_cast<int>(V - base < kPickChunk ? V - base : kPickChunk);
  constexpr int kItems = kPickChunk / kFinalThreads;  // 2
  double w[kItems], pre[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = threadIdx.x * kItems + k;
    w[k] = i < n ? double(weight(__ldcg(b.v + base + i), mx, floor)) : 0.0;
  }
  extern __shared__ __align__(16) unsigned char pick_smem[];
  FinalScan(*reinterpret_cast<typename FinalScan::TempStorage*>(pick_smem)).InclusiveSum(w, pre);
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = threadIdx.x * kItems + k;
    if (i < n && pre[k] > s_r) atomicMin(&s_first, i);
    if (i < n && w[k] > 0.0) atomicMax(&s_last, i);
  }
  __syncthreads();
  const int i = s_first != INT_MAX ? s_first : s_last;
  return {i >= 0 ? static_cast<int>(base + i) : top, 0};
}

// Top-k / top-p / min-p from the blocks' candidate lists.
__device__ Pick pick_candidates(const PickDevice& p, int64_t V, const PickBuffers& b, int nb, float mx,
                                unsigned long long topk_key, double u) {
  __shared__ unsigned long long red[kFinalThreads / 32];
  __shared__ int s_count, s_cut_p, s_cut_m, s_first, s_last, s_token;
  __shared__ double s_z, s_total;
  extern __shared__ __align__(16) unsigned char pick_smem[];
  const int c = candidates_per_block(p);
  // The exact prefix: every token whose key is above each full block's last candidate is among the candidates.
  unsigned long long tau = 0;
  if (p.top_k == 0)
    for (int blk = threadIdx.x; blk < nb; blk += kFinalThreads) {
      const int64_t n = V - int64_t(blk) * kPickChunk;
      if (n > c) {
        const unsigned long long k =
            __ldcg(reinterpret_cast<const unsigned long long*>(b.cand) + size_t(blk) * kC + (c - 1));
        tau = k > tau ? k : tau;
      }
    }
  tau = block_max<kFinalThreads>(tau, red);
  unsigned long long keys[kFinalItems];
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k) {
    const int s = threadIdx.x * kFinalItems + k;
    const int blk = s / c, r = s % c;
    keys[k] = blk < nb ? __ldcg(reinterpret_cast<const unsigned long long*>(b.cand) + size_t(blk) * kC + r) : 0ull;
  }
  if (threadIdx.x == 0) {
    s_count = 0;
    s_cut_p = s_cut_m = s_first = INT_MAX;
    s_last = -1;
    s_token = -1;
  }
  FinalSort(*reinterpret_cast<typename FinalSort::TempStorage*>(pick_smem)).SortDescending(keys);
  __syncthreads();  // the sort's storage is the scan's next
  int above = 0;
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k) above += keys[k] > tau;
  atomicAdd(&s_count, above);
  __syncthreads();
  const int L = p.top_k > 0 ? p.top_k : s_count;  // ranks [0, L) are the global order's first L tokens
  double e[kFinalItems], pre[kFinalItems];
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k) {
    const int r = threadIdx.x * kFinalItems + k;
    e[k] = r < L ? exp(double(key_value(keys[k]) - mx)) : 0.0;
  }
  FinalScan(*reinterpret_cast<typename FinalScan::TempStorage*>(pick_smem)).InclusiveSum(e, pre);
  if (p.top_k > 0) {  // top-k renormalises over its k
#pragma unroll
    for (int k = 0; k < kFinalItems; ++k)
      if (threadIdx.x * kFinalItems + k == L - 1) s_z = pre[k];
  } else if (threadIdx.x == 0) {  // top-p alone: the whole vocabulary's total, as launch 2 summed it
    double z = 0;
    for (int i = 0; i < nb; ++i) z += __ldcg(b.bsum + i);
    s_z = z;
  }
  __syncthreads();
  const float thr = key_value(topk_key) + p.log_min_p;
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k) {
    const int r = threadIdx.x * kFinalItems + k;
    if (r >= L) continue;
    if (p.top_p < 1.0f && pre[k] / s_z >= double(p.top_p)) atomicMin(&s_cut_p, r);
    if (p.min_p > 0.0f && key_value(keys[k]) < thr) atomicMin(&s_cut_m, r);
  }
  __syncthreads();
  int keep = L;
  if (p.top_p < 1.0f) {
    if (s_cut_p != INT_MAX)
      keep = s_cut_p + 1;
    else if (p.top_k == 0 && int64_t(L) < V)
      return {-1, 2};  // the nucleus reaches past the exact prefix: the host picks
  }
  if (s_cut_m < keep) keep = s_cut_m;
  if (keep < 1) keep = 1;
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k)
    if (threadIdx.x * kFinalItems + k == keep - 1) s_total = pre[k];
  __syncthreads();
  const double rr = u * s_total;
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k) {
    const int r = threadIdx.x * kFinalItems + k;
    if (r >= keep) continue;
    if (pre[k] > rr) atomicMin(&s_first, r);
    if (e[k] > 0.0) atomicMax(&s_last, r);
  }
  __syncthreads();
  const int want = s_first != INT_MAX ? s_first : (s_last >= 0 ? s_last : 0);
#pragma unroll
  for (int k = 0; k < kFinalItems; ++k)
    if (threadIdx.x * kFinalItems + k == want) s_token = key_index(keys[k]);
  __syncthreads();
  return {s_token, 0};
}

// Launch 3: the draw, the token into ids[0] and the result; the draw counter advances and the flags clear.
__global__ void __launch_bounds__(kFinalThreads, 1) pick_final_kernel(int64_t V, int nb, PickBuffers b, int32_t* ids) {
  pdl_wait();
  pdl_trigger();
  const PickDevice p = *b.params;
  if (!p.enabled) return;
  __shared__ unsigned long long red[kFinalThreads / 32];
  const double u = pick_uniform(p.seed, p.draw);
  const bool nan = __ldcg(b.flags) != 0;
  const unsigned long long top = top_key<kFinalThreads>(b.cand, nb, red);
  const float mx = key_value(top);
  Pick r{key_index(top), 0};
  if (nan)
    r = {-1, 1};
  else if (p.temperature > 0.0f && isfinite(mx))
    r = wants_candidates(p) ? pick_candidates(p, V, b, nb, mx, top, u) : pick_whole(p, V, b, nb, mx, r.token, u);
  if (threadIdx.x == 0) {
    if (r.status == 0) ids[0] = r.token;
    b.result->token = r.token;
    b.result->status = r.status;
    *b.flags = 0;
    b.params->draw = p.draw + 1;
  }
}

}  // namespace

void pick(const Ctx& c, const float* logits, int64_t V, const PickBuffers& b, int32_t* ids) {
  const int nb = pick_blocks(V);
  launch(c, "pick_prep_kernel", pick_prep_kernel, nb, kPrepThreads, 0, logits, V, b, ids);
  FERN_CUDA_LAUNCH_CHECK("pick_prep_kernel");
  launch(c, "pick_sums_kernel", pick_sums_kernel, nb, kPrepThreads, 0, V, b);
  FERN_CUDA_LAUNCH_CHECK("pick_sums_kernel");
  constexpr size_t smem = sizeof(typename FinalSort::TempStorage) > sizeof(typename FinalScan::TempStorage)
                              ? sizeof(typename FinalSort::TempStorage)
                              : sizeof(typename FinalScan::TempStorage);
  allow_dynamic_smem<pick_final_kernel>(smem);
  launch(c, "pick_final_kernel", pick_final_kernel, 1, kFinalThreads, smem, V, nb, b, ids);
  FERN_CUDA_LAUNCH_CHECK("pick_final_kernel");
}

}  // namespace fern::cuda
