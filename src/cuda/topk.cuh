// Router softmax + top-k for one token, run by one warp: used by the stand-alone top-k kernel and by the tail of
// the fused router GEMV (linear.cu). The E <= 1024 probabilities live in registers (E / 32 per lane, rounded up
// to a power of two), so softmax, the k rounds of argmax (warp shuffles, lowest index on ties) and the renormalisation need no shared
// memory or barriers. Inputs are read through L2 (__ldcg): in the fused router they were written by other blocks
// of the same launch.
#pragma once
#include <cstdint>

#include "cuda/cuda_util.cuh"

namespace fern::cuda {

constexpr int kTopkMaxPerLane = 32;

__device__ __forceinline__ void argmax_pair(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// logits [E], *sg_logit -> ids [k], wts [k] (renormalised softmax weights), *sgate = sigmoid(*sg_logit).
// Called by all 32 lanes of one warp. NPL values per lane (E <= 32 * NPL): a compile-time count so that the
// values stay in registers and only the needed ones are scanned (256 experts: 8 per lane, not 32). Each lane keeps
// the best of its own values; a round is one warp argmax over those 32 candidates, after which only the winner's
// lane rescans its values (v2 rescanned all 32 values on every lane every round).
template <int NPL>
__device__ __forceinline__ void topk_warp_n(const float* logits, const float* sg_logit, int E, int k, int32_t* ids,
                                            float* wts, float* sgate) {
  const int lane = threadIdx.x & 31;
  float p[NPL];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int e = i * 32 + lane;
    p[i] = e < E ? __ldcg(logits + e) : -INFINITY;
    m = fmaxf(m, p[i]);
  }
  m = warp_max(m);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int e = i * 32 + lane;
    p[i] = e < E ? expf(p[i] - m) : -1.0f;  // -1: not an expert (never chosen)
    sum += e < E ? p[i] : 0.0f;
  }
  const float inv = 1.0f / warp_sum(sum);
  // This lane's best value (lowest index on ties: i ascending and strict >).
  auto local_best = [&](float& v, int& idx) {
    v = -2.0f;
    idx = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < NPL; ++i) argmax_pair(v, idx, p[i], i * 32 + lane);
  };
  float lv;
  int li;
  local_best(lv, li);
  float chosen_sum = 0.0f, my_w = 0.0f;
  int my_id = 0;
  for (int r = 0; r < k; ++r) {
    float bv = lv;
    int bi = li;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      argmax_pair(bv, bi, ov, oi);
    }
    // Every lane now holds the winner; its owner marks it taken and finds its next best.
    if (bi == li) {
#pragma unroll
      for (int i = 0; i < NPL; ++i)
        if (i * 32 + lane == bi) p[i] = -2.0f;
      local_best(lv, li);
    }
    const float pv = bv * inv;
    chosen_sum += pv;
    if (lane == r) {
      my_w = pv;
      my_id = bi;
    }
  }
  if (lane < k) {
    ids[lane] = my_id;
    wts[lane] = my_w / chosen_sum;
  }
  if (lane == 0) *sgate = 1.0f / (1.0f + expf(-__ldcg(sg_logit)));
}

// Dispatch on the expert count: the smallest power-of-two values per lane that covers E (E <= 1024).
__device__ __forceinline__ void topk_warp(const float* logits, const float* sg_logit, int E, int k, int32_t* ids,
                                          float* wts, float* sgate) {
  if (E <= 32) {
    topk_warp_n<1>(logits, sg_logit, E, k, ids, wts, sgate);
  } else if (E <= 64) {
    topk_warp_n<2>(logits, sg_logit, E, k, ids, wts, sgate);
  } else if (E <= 128) {
    topk_warp_n<4>(logits, sg_logit, E, k, ids, wts, sgate);
  } else if (E <= 256) {
    topk_warp_n<8>(logits, sg_logit, E, k, ids, wts, sgate);
  } else if (E <= 512) {
    topk_warp_n<16>(logits, sg_logit, E, k, ids, wts, sgate);
  } else {
    topk_warp_n<kTopkMaxPerLane>(logits, sg_logit, E, k, ids, wts, sgate);
  }
}

}  // namespace fern::cuda
