// Gated DeltaNet prefill micro-benchmark (docs/notes/cuda-prefill-v2-gdn.md): one layer's gdn_core at the real
// shapes (16 key heads, 32 value heads, 128 dims, conv kernel 4) for T rows, the old path (the one-token kernel
// launched once per row) against the multi-row kernels (conv pre-pass, register-resident scan, gated norm), with
// the new path's three launches also timed one by one (the scan in each of its variants: 4 or 8 threads per state column, 1 or 2 columns per thread). Inputs are random device fills (decays ~0.98 per row);
// each figure is the median of 7 timed calls (CUDA events, after one warm-up) on a state that keeps evolving.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/gdn_prefill.h"
#include "cuda/kernels.h"

using namespace fern;

namespace {
// The kernels run on the legacy default stream (a default cuda::Ctx).
double median_ms(const std::function<void()>& f, int reps = 7) { return bench::median_ms(nullptr, f, reps); }

float* dev_uniform(int64_t n, uint64_t seed, float lo, float hi) {
  float* p = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&p, size_t(n) * sizeof(float)));
  cuda::fill_random_f32(nullptr, p, n, seed, lo, hi);
  return p;
}

}  // namespace

int main() {
  cuda::GdnShape sh{};
  sh.Hk = 16;
  sh.Hv = 32;
  sh.Dk = 128;
  sh.Dv = 128;
  sh.kernel = 4;
  sh.conv_dim = 2 * sh.Hk * sh.Dk + sh.Hv * sh.Dv;
  sh.eps = 1e-6f;
  const int Ts[] = {64, 512, 2048, 4096};
  const int maxT = 4096;
  const int64_t C = sh.conv_dim, V = int64_t(sh.Hv) * sh.Dv;

  cuda::Ctx ctx;
  int dev = 0;
  FERN_CUDA_CHECK(cudaGetDevice(&dev));
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sms, cudaDevAttrMultiProcessorCount, dev));
  FERN_CUDA_CHECK(cudaMalloc(&ctx.counters, sizeof(int) * 1024));
  FERN_CUDA_CHECK(cudaMemset(ctx.counters, 0, sizeof(int) * 1024));
  ctx.n_counters = 1024;

  float* mixed = dev_uniform(maxT * C, 1, -2.0f, 2.0f);
  float* z = dev_uniform(maxT * V, 2, -2.0f, 2.0f);
  float* b = dev_uniform(maxT * sh.Hv, 3, -2.0f, 2.0f);
  float* a = dev_uniform(maxT * sh.Hv, 4, -2.0f, 2.0f);
  float* conv_w = dev_uniform(C * sh.kernel, 5, -0.5f, 0.5f);
  float* A_log = dev_uniform(sh.Hv, 6, -4.5f, -3.5f);
  float* dt_bias = dev_uniform(sh.Hv, 7, -1.0f, 0.0f);
  float* norm_w = dev_uniform(sh.Dv, 8, 0.9f, 1.1f);
  float* conv_state = dev_uniform((sh.kernel - 1) * C, 9, -1.0f, 1.0f);
  float* state = dev_uniform(int64_t(sh.Hv) * sh.Dk * sh.Dv, 10, -0.1f, 0.1f);
  float* y = dev_uniform(maxT * V, 11, -1.0f, 1.0f);
  float* xc = dev_uniform(cuda::gdn_prefill_scratch_floats(sh, maxT), 12, -1.0f, 1.0f);

  std::printf("| T | per-row gdn_step (ms) | multi-row (ms) | speed-up | conv pre-pass (ms) | scan: 4 slices | 8 slices | "
              "8 slices x 2 columns (ms) | norm (ms) | default scan us/row |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int T : Ts) {
    const double old_ms = median_ms(
        [&] {
          for (int t = 0; t < T; ++t)
            cuda::gdn_step(ctx, sh, t, mixed, z, b, a, conv_w, A_log, dt_bias, norm_w, conv_state, state, y);
        },
        T >= 2048 ? 3 : 7);
    const double new_ms = median_ms([&] {
      cuda::gdn_prefill(ctx, sh, T, mixed, z, b, a, conv_w, A_log, dt_bias, norm_w, conv_state, state, y, xc);
    });
    const double conv_ms = median_ms([&] { cuda::gdn_prefill_conv(ctx, sh, T, mixed, conv_w, conv_state, xc); });
    double scan_ms[4];
    for (int v = 0; v < 4; ++v)
      scan_ms[v] = median_ms(
          [&] { cuda::gdn_prefill_scan(ctx, sh, T, xc, b, a, A_log, dt_bias, state, y, cuda::GdnScan(v)); });
    const double norm_ms = median_ms([&] { cuda::gdn_prefill_norm(ctx, sh, T, z, norm_w, y); });
    std::printf("| %d | %.3f | %.3f | %.1fx | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", T, old_ms, new_ms,
                old_ms / new_ms, conv_ms, scan_ms[1], scan_ms[2], scan_ms[3], norm_ms, scan_ms[0] * 1e3 / T);
    std::fflush(stdout);
  }
  for (float* p : {mixed, z, b, a, conv_w, A_log, dt_bias, norm_w, conv_state, state, y, xc})
    FERN_CUDA_CHECK(cudaFree(p));
  FERN_CUDA_CHECK(cudaFree(ctx.counters));
  return 0;
}
