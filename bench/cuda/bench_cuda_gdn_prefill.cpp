// Gated DeltaNet prefill micro-benchmark (docs/notes/cuda-prefill-v2-gdn.md, cuda-prefill-v4-gdn.md): one layer's
// GDN core at the real shapes (16 key heads, 32 value heads, 128 dims, conv kernel 4) for T rows, with the delta
// rule in its two forms: the register-resident scan (its default variant, 8 slices x 2 columns) and the chunked WY
// form on the tensor cores (gdn_chunked.cu). Each row of the table: the whole core (conv pre-pass + delta rule +
// gated norm) in each form, and the parts one by one. T = 32768 is one call of 32K rows (the scratch of the
// chunked form is then 1 GB of conv output + 1.35 GB of workspace); "32768 = 16 x 2048" runs the same rows as 16
// calls of 2,048 carrying the state, as the engine's 2,048-row prefill chunks do. Inputs are random device fills
// (decays ~0.98 per row); each figure is the median of 7 timed calls (CUDA events, after one warm-up) on a state
// that keeps evolving. Arguments, if any: the T values to run instead of the default list (e.g. `8192`, for a
// profiler: the first launch of each kernel is then at that T), without the 16 x 2,048 row.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

int main(int argc, char** argv) {
  cuda::GdnShape sh{};
  sh.Hk = 16;
  sh.Hv = 32;
  sh.Dk = 128;
  sh.Dv = 128;
  sh.kernel = 4;
  sh.conv_dim = 2 * sh.Hk * sh.Dk + sh.Hv * sh.Dv;
  sh.eps = 1e-6f;
  std::vector<int> Ts = {16, 64, 128, 256, 512, 1024, 2048, 4096, 32768};
  if (argc > 1) {
    Ts.clear();
    for (int i = 1; i < argc; ++i) Ts.push_back(std::atoi(argv[i]));
    if (std::any_of(Ts.begin(), Ts.end(), [](int t) { return t < 1 || t > 32768; })) {
      std::fprintf(stderr, "usage: bench_cuda_gdn_prefill [T ...] (1 <= T <= 32768)\n");
      return 2;
    }
  }
  const int maxT = 32768;
  const int64_t C = sh.conv_dim, V = int64_t(sh.Hv) * sh.Dv;

  cuda::Ctx ctx;
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
  float* xc = dev_uniform(cuda::gdn_prefill_scratch_floats(sh, maxT, cuda::GdnForm::Chunked), 12, -1.0f, 1.0f);
  float* ws = xc + int64_t(maxT) * C;

  std::printf("| T | scan core (ms) | chunked core (ms) | chunked speed-up | conv pre-pass | scan kernel | chunked: "
              "per-chunk kernel | chunked: state kernel | norm | scan us/row | chunked us/row |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int T : Ts) {
    const int reps = T >= 32768 ? 5 : 7;
    const double scan_ms = median_ms([&] {
      cuda::gdn_prefill(ctx, sh, T, mixed, z, b, a, conv_w, A_log, dt_bias, norm_w, conv_state, state, y, xc);
    }, reps);
    const double chunk_ms = median_ms([&] {
      cuda::gdn_prefill(ctx, sh, T, mixed, z, b, a, conv_w, A_log, dt_bias, norm_w, conv_state, state, y, xc,
                        cuda::GdnForm::Chunked);
    }, reps);
    const double conv_ms = median_ms([&] { cuda::gdn_prefill_conv(ctx, sh, T, mixed, conv_w, conv_state, xc); });
    const double scank_ms =
        median_ms([&] { cuda::gdn_prefill_scan(ctx, sh, T, xc, b, a, A_log, dt_bias, state, y); }, reps);
    const double prep_ms = median_ms([&] { cuda::gdn_chunked_prep(ctx, sh, T, xc, b, a, A_log, dt_bias, ws); });
    const double statek_ms = median_ms([&] { cuda::gdn_chunked_state(ctx, sh, T, xc, ws, state, y); }, reps);
    const double norm_ms = median_ms([&] { cuda::gdn_prefill_norm(ctx, sh, T, z, norm_w, y); });
    std::printf("| %d | %.3f | %.3f | %.2fx | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", T, scan_ms, chunk_ms,
                scan_ms / chunk_ms, conv_ms, scank_ms, prep_ms, statek_ms, norm_ms, scank_ms * 1e3 / T,
                (prep_ms + statek_ms) * 1e3 / T);
    std::fflush(stdout);
  }
  // 32K rows as the engine runs them: 16 calls of 2,048 rows, the state carried.
  if (argc > 1) return 0;
  constexpr int kCall = 2048, kCalls = 16;
  auto calls = [&](cuda::GdnForm form) {
    return median_ms([&] {
      for (int i = 0; i < kCalls; ++i) {
        const int64_t r0 = int64_t(i) * kCall;
        cuda::gdn_prefill(ctx, sh, kCall, mixed + r0 * C, z + r0 * V, b + r0 * sh.Hv, a + r0 * sh.Hv, conv_w, A_log,
                          dt_bias, norm_w, conv_state, state, y + r0 * V, xc, form);
      }
    }, 5);
  };
  const double scan16 = calls(cuda::GdnForm::Scan), chunk16 = calls(cuda::GdnForm::Chunked);
  std::printf("| 32768 = 16 x 2048 | %.3f | %.3f | %.2fx | | | | | | %.3f | %.3f |\n", scan16, chunk16, scan16 / chunk16,
              scan16 * 1e3 / (kCall * kCalls), chunk16 * 1e3 / (kCall * kCalls));
  for (float* p : {mixed, z, b, a, conv_w, A_log, dt_bias, norm_w, conv_state, state, y, xc})
    FERN_CUDA_CHECK(cudaFree(p));
  return 0;
}
