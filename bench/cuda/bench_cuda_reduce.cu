// What the decode MoE would pay to sum its down projection's outputs if that projection were split by its input
// dimension (each block's h values, from its own gate/up rows, times the matching columns of the experts' down
// matrices, for all D output rows) instead of by output rows (today: a grid-wide handoff of h, then each block's
// down rows over the whole of h; docs/notes/cuda-decode-v38-reduce.md). The split form needs no handoff inside the
// kernel, but every block adds a partial vector of D values into the output. Measured here per launch, with a
// launch of an empty kernel of the same grid subtracted:
//   handoff        the fused MoE's form: each block writes its share of h (H values), fence + atomic arrival, polls
//                  until all blocks arrived, then reads all of h from L2 (H floats) and sums it;
//   handoff / S    the same within S groups of blocks (block b in group b mod S), each with its own counter and
//                  H / S values of h, read only by its own blocks: the fused MoE by slot groups (S = 9: eight
//                  experts and the shared one; docs/notes/cuda-decode-v39-gdn-fused.md section 6);
//   red s64 / S    that form's sum of the slots: each group's blocks split the D outputs among them and add their
//                  share by 64-bit fixed-point reductions, so every output gets S additions (not one per block);
//   red f32        each block adds its D partials to out by scalar float reductions (red.global.add.f32);
//   red v4         the same with 16-byte vector reductions (sm_90: atomicAdd on float4);
//   red s64        64-bit fixed-point reductions (the order of the additions cannot change the bits);
//   cluster C ...  C blocks of a cluster first add their partials through distributed shared memory, then each
//                  block adds D / C of the cluster's sum (C = 2, 4, 8; a grid of whole clusters);
// Every sum is checked against the host (the partials are small multiples of 2^-6, so every order gives the same
// floats): "ok" or "WRONG".
// Usage: bench_cuda_reduce [D (2048)] [H (4608)] [launches per graph (64)]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_launch.h"
#include "bench_timing.h"
#include "cuda/cuda_check.h"

namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 256;
cudaStream_t g_stream = nullptr;  // every launch, captured into the timed graphs

// Block b's partial for output i, a multiple of 2^-6 below 1 in magnitude (exact in any order of fp32 additions
// over a few hundred blocks, and as 2^32 fixed point).
__host__ __device__ inline float partial(int b, int i) { return float((b * 37 + i * 11) % 101 - 50) * 0.015625f; }
__host__ __device__ inline long long to_fixed(float v) { return static_cast<long long>(v * 4294967296.0f); }

__global__ void empty_kernel() {}

// FORM 0: scalar float reductions, 1: float4 reductions, 2: 64-bit fixed point. C = 1: no cluster.
template <int FORM, int C>
__global__ void __launch_bounds__(kThreads) reduce_kernel(float* out, unsigned long long* out64, int D) {
  extern __shared__ float part[];  // [D] this block's partials (cluster forms)
  const int b = static_cast<int>(blockIdx.x);
  auto add4 = [&](int i, float4 v) {
    if constexpr (FORM == 0) {
      atomicAdd(out + i, v.x);
      atomicAdd(out + i + 1, v.y);
      atomicAdd(out + i + 2, v.z);
      atomicAdd(out + i + 3, v.w);
    } else if constexpr (FORM == 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(out + i), v);
#endif
    } else {
      atomicAdd(out64 + i, static_cast<unsigned long long>(to_fixed(v.x)));
      atomicAdd(out64 + i + 1, static_cast<unsigned long long>(to_fixed(v.y)));
      atomicAdd(out64 + i + 2, static_cast<unsigned long long>(to_fixed(v.z)));
      atomicAdd(out64 + i + 3, static_cast<unsigned long long>(to_fixed(v.w)));
    }
  };
  if constexpr (C == 1) {
    for (int i = 4 * static_cast<int>(threadIdx.x); i < D; i += 4 * kThreads)
      add4(i, make_float4(partial(b, i), partial(b, i + 1), partial(b, i + 2), partial(b, i + 3)));
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cl = cg::this_cluster();
    for (int i = static_cast<int>(threadIdx.x); i < D; i += kThreads) part[i] = partial(b, i);
    cl.sync();
    const int n = D / C, r = static_cast<int>(cl.block_rank());
    for (int i = r * n + 4 * static_cast<int>(threadIdx.x); i < (r + 1) * n; i += 4 * kThreads) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int q = 0; q < C; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(cl.map_shared_rank(part, q) + i);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      add4(i, s);
    }
    cl.sync();  // the other blocks' reads of this block's partials are done before it exits
#endif
  }
}

// red s64 / S: block b (group g = b mod S of n blocks, rank r = b / S) adds its partials for outputs
// [r D / n, (r + 1) D / n) by 64-bit fixed-point reductions.
__global__ void __launch_bounds__(kThreads) slot_sum_kernel(unsigned long long* out64, int D, int S) {
  const int b = static_cast<int>(blockIdx.x), G = static_cast<int>(gridDim.x);
  const int g = b % S, r = b / S, n = (G - g + S - 1) / S;
  const int i0 = r * D / n, i1 = (r + 1) * D / n;
  for (int i = i0 + static_cast<int>(threadIdx.x); i < i1; i += kThreads)
    atomicAdd(out64 + i, static_cast<unsigned long long>(to_fixed(partial(b, i))));
}

// The handoff among the S groups of blocks (S = 1: the whole grid; all blocks resident: one per SM). Block b is in
// group g = b mod S, of n blocks, rank r = b / S there; group g's slice of h is [g Hs, g Hs + Hs), Hs = H / S. The
// block writes its rank's share of the slice, counts itself in at counter[g] and waits for its group, then every
// thread reads its share of the slice and the block's sum goes to sink[b].
__global__ void __launch_bounds__(kThreads) handoff_kernel(float* h, int H, int S, unsigned* counter, float* sink) {
  __shared__ float red[kThreads / 32];
  __shared__ unsigned target;
  const int b = static_cast<int>(blockIdx.x), G = static_cast<int>(gridDim.x);
  const int g = b % S, r = b / S, n = (G - g + S - 1) / S, Hs = H / S;
  const int per = (Hs + n - 1) / n;
  float* hs = h + g * Hs;
  if (threadIdx.x == 0) {
    // Launches run in stream order, so the counter holds a multiple of n plus this launch's arrivals so far, and
    // this block has not arrived yet.
    const unsigned c = *reinterpret_cast<volatile unsigned*>(counter + g);
    target = (c / n + 1) * n;
  }
  for (int i = static_cast<int>(threadIdx.x); i < per; i += kThreads)
    if (r * per + i < Hs) hs[r * per + i] = partial(b, i);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter + g, 1u);
    while (*reinterpret_cast<volatile unsigned*>(counter + g) < target) {
    }
    __threadfence();
  }
  __syncthreads();
  float s = 0.f;
  for (int i = static_cast<int>(threadIdx.x); i < Hs; i += kThreads) s += __ldcg(hs + i);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) t += red[w];
    sink[b] = t;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fern;
  try {
    const int D = argc > 1 ? std::atoi(argv[1]) : 2048;
    const int H = argc > 2 ? std::atoi(argv[2]) : 4608;
    const int L = argc > 3 ? std::atoi(argv[3]) : 64;
    if (D < 64 || D % 64 != 0 || D > 16384 || H < 1 || H > (1 << 20) || L < 1 || L > 4096) {
      std::fprintf(stderr, "usage: bench_cuda_reduce [D: multiple of 64, <= 16384] [H <= 2^20] [launches 1..4096]\n");
      return 2;
    }
    int sms = 0, major = 0;
    FERN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    FERN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    float *out = nullptr, *h = nullptr, *sink = nullptr;
    unsigned long long* out64 = nullptr;
    unsigned* counter = nullptr;
    FERN_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    FERN_CUDA_CHECK(cudaMalloc(&out, sizeof(float) * D));
    FERN_CUDA_CHECK(cudaMalloc(&out64, sizeof(unsigned long long) * D));
    FERN_CUDA_CHECK(cudaMalloc(&h, sizeof(float) * H));
    FERN_CUDA_CHECK(cudaMalloc(&sink, sizeof(float) * sms));
    constexpr int kMaxGroups = 16;
    FERN_CUDA_CHECK(cudaMalloc(&counter, sizeof(unsigned) * kMaxGroups));
    FERN_CUDA_CHECK(cudaMemset(counter, 0, sizeof(unsigned) * kMaxGroups));
    const size_t smem = sizeof(float) * D;

    // The launch of mode m with grid G: one call of the form's kernel.
    struct Mode {
      std::string name;
      int form, C;  // form: 0..2 reductions, 3 handoff (C: its groups), 4 empty, 5 the slots' sum (C: groups)
    };
    std::vector<Mode> modes = {{"empty", 4, 1},         {"handoff", 3, 1}, {"handoff / 9", 3, 9},
                               {"handoff / 16", 3, 16}, {"red f32", 0, 1}, {"red s64", 2, 1},
                               {"red s64 / 9", 5, 9}};
    if (major >= 9) {
      modes.push_back({"red v4", 1, 1});
      for (int C : {2, 4, 8}) {
        modes.push_back({"cluster " + std::to_string(C) + " + red v4", 1, C});
        modes.push_back({"cluster " + std::to_string(C) + " + red s64", 2, C});
      }
    }
    auto launch = [&](const Mode& m, int G) {
      if (m.form == 4) {
        empty_kernel<<<G, kThreads, 0, g_stream>>>();
      } else if (m.form == 3) {
        handoff_kernel<<<G, kThreads, 0, g_stream>>>(h, H, m.C, counter, sink);
      } else if (m.form == 5) {
        slot_sum_kernel<<<G, kThreads, 0, g_stream>>>(out64, D, m.C);
      } else {
        // No PDL: each launch starts after the previous one has finished and its sums are visible.
        auto pick = [&](auto k) {
          bench::launch_ex(g_stream, k, G, kThreads, m.C > 1 ? smem : 0, m.C, false, out, out64, D);
        };
        switch (m.form * 10 + m.C) {
          case 1: pick(reduce_kernel<0, 1>); break;
          case 11: pick(reduce_kernel<1, 1>); break;
          case 21: pick(reduce_kernel<2, 1>); break;
          case 12: pick(reduce_kernel<1, 2>); break;
          case 14: pick(reduce_kernel<1, 4>); break;
          case 18: pick(reduce_kernel<1, 8>); break;
          case 22: pick(reduce_kernel<2, 2>); break;
          case 24: pick(reduce_kernel<2, 4>); break;
          case 28: pick(reduce_kernel<2, 8>); break;
          default: std::abort();
        }
      }
      FERN_CUDA_CHECK(cudaGetLastError());
    };
    for (auto* k : {reduce_kernel<1, 2>, reduce_kernel<1, 4>, reduce_kernel<1, 8>, reduce_kernel<2, 2>,
                    reduce_kernel<2, 4>, reduce_kernel<2, 8>})
      FERN_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));

    std::printf("D = %d outputs, H = %d values of h, %d launches per graph, %d SMs\n\n", D, H, L, sms);
    std::printf("%-24s %5s %12s %12s %6s\n", "mode", "grid", "us/launch", "minus empty", "check");
    double empty_us = 0.0;
    for (const Mode& m : modes) {
      const int G = m.C > 1 && m.form <= 2 ? sms / m.C * m.C : sms;  // whole clusters
      // Check one launch.
      FERN_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * D, g_stream));
      FERN_CUDA_CHECK(cudaMemsetAsync(out64, 0, sizeof(unsigned long long) * D, g_stream));
      launch(m, G);
      FERN_CUDA_CHECK(cudaStreamSynchronize(g_stream));
      bool ok = true;
      if (m.form <= 2) {
        std::vector<float> got(D);
        std::vector<unsigned long long> got64(D);
        FERN_CUDA_CHECK(cudaMemcpy(got.data(), out, sizeof(float) * D, cudaMemcpyDeviceToHost));
        FERN_CUDA_CHECK(cudaMemcpy(got64.data(), out64, sizeof(unsigned long long) * D, cudaMemcpyDeviceToHost));
        for (int i = 0; i < D && ok; ++i) {
          float want = 0.f;
          long long want64 = 0;
          for (int b = 0; b < G; ++b) {
            want += partial(b, i);
            want64 += to_fixed(partial(b, i));
          }
          ok = m.form == 2 ? static_cast<long long>(got64[i]) == want64 : got[i] == want;
        }
      } else if (m.form == 5) {
        std::vector<unsigned long long> got64(D);
        FERN_CUDA_CHECK(cudaMemcpy(got64.data(), out64, sizeof(unsigned long long) * D, cudaMemcpyDeviceToHost));
        std::vector<long long> want(D, 0);
        for (int b = 0; b < G; ++b) {
          const int S = m.C, g = b % S, r = b / S, n = (G - g + S - 1) / S;
          for (int i = r * D / n; i < (r + 1) * D / n; ++i) want[i] += to_fixed(partial(b, i));
        }
        for (int i = 0; i < D && ok; ++i) ok = static_cast<long long>(got64[i]) == want[i];
      } else if (m.form == 3) {
        // Block 0's sum: group 0's slice, written by the blocks b = 0, S, 2 S, ... (rank b / S).
        float got = 0.f;
        FERN_CUDA_CHECK(cudaMemcpy(&got, sink, sizeof(float), cudaMemcpyDeviceToHost));
        const int S = m.C, n = (G + S - 1) / S, Hs = H / S, per = (Hs + n - 1) / n;
        double want = 0.0;
        for (int r = 0; r < n; ++r)
          for (int i = 0; i < per && r * per + i < Hs; ++i) want += partial(r * S, i);
        ok = got == static_cast<float>(want);
      }
      const double us = bench::graph_median_ms(g_stream, [&] {
                          for (int i = 0; i < L; ++i) launch(m, G);
                        }) *
                        1e3 / L;
      if (m.form == 4) empty_us = us;
      std::printf("%-24s %5d %12.2f %12.2f %6s\n", m.name.c_str(), G, us, us - empty_us, ok ? "ok" : "WRONG");
    }
    cudaFree(out);
    cudaFree(out64);
    cudaFree(h);
    cudaFree(sink);
    cudaFree(counter);
    cudaStreamDestroy(g_stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
