// Prefill linear micro-benchmark (docs/notes/cuda-prefill-v1.md, -v3-gemm.md, -v4-wg.md): the tensor-core multi-row
// kernel (linear_gemm) on each tile loop: the precise split loop (no workspace, FERN_GEMM=split), the fp16 loop (x
// converted once to fp16 rows, then the pipelined kernel), the precise fp16x2 loop (hi + lo rows, exact codes) and,
// where the GPU and build run it, the wgmma loop (wg: x split once into bf16 hi/lo rows); each timed with its
// conversion. Against the row-by-row GEMV (the T > 1 path before the GEMM), at the real 4-bit shapes, for several
// token counts. Weights and activations are random device fills; each figure is the median of 7 timed launches
// (CUDA events, after one warm-up). Effective TFLOP/s counts 2 * T * out * in. FERN_BENCH_DEFAULT_ONLY=1 times only
// the default path (the other columns 0): for comparing builds of the same loop in one short GPU call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/gemm_f16.h"
#include "cuda/gemm_wg.h"
#include "cuda/kernels.h"

using namespace fern;

namespace {
// The kernels run on the legacy default stream (a default cuda::Ctx).
double median_ms(const std::function<void()>& f, int reps = 7) { return bench::median_ms(nullptr, f, reps); }
}  // namespace

int main() {
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  const Shape shapes[] = {{"gdn in_proj_qkv", 8192, 2048}, {"out_proj", 2048, 4096}, {"expert-size", 512, 2048},
                          {"lm_head", 248320, 2048}};
  const std::vector<int> Ts = bench::bench_rows({64, 256, 1024, 2048, 4096});
  cuda::Ctx ctx;
  int dev = 0;
  FERN_CUDA_CHECK(cudaGetDevice(&dev));
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sms, cudaDevAttrMultiProcessorCount, dev));
  const bool wg = cuda::gemm_wg_supported();
  const char* only = std::getenv("FERN_BENCH_DEFAULT_ONLY");
  const bool default_only = only != nullptr && only[0] == '1';
  std::printf(
      "| shape | T | GEMV row by row (ms) | split (ms) | fp16 (ms) | fp16x2 (ms) | wg sync, 4 stages (ms) | wg sync, 2 stages "
      "(ms) | wg warp-specialized (ms) | wg exact codes (q4b, default) (ms) | x to bf16 hi/lo alone | default vs split | split "
      "TFLOP/s | fp16 TFLOP/s | wg ws TFLOP/s | default TFLOP/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  void* ws = nullptr;
  const size_t ws_bytes = cuda::x16_bytes(4096, 4096, true);
  FERN_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  cuda::Ctx fctx = ctx;
  fctx.gemm_ws = ws;
  fctx.gemm_ws_bytes = ws_bytes;
  cuda::Ctx pctx = fctx;
  pctx.gemm_precise = true;
  cuda::Ctx wctx = fctx;
  wctx.gemm_wg = true;
  for (const Shape& s : shapes) {
    void *w, *sc, *bi, *x, *y;
    const int64_t words = s.out * s.in / 8, groups = s.out * s.in / 64;
    const int maxT = s.out > 100000 ? 1024 : 4096;  // lm_head output at 4096 rows would be 4 GB
    FERN_CUDA_CHECK(cudaMalloc(&w, size_t(words) * 4));
    FERN_CUDA_CHECK(cudaMalloc(&sc, size_t(groups) * 2));
    FERN_CUDA_CHECK(cudaMalloc(&bi, size_t(groups) * 2));
    FERN_CUDA_CHECK(cudaMalloc(&x, size_t(maxT * s.in) * 4));
    FERN_CUDA_CHECK(cudaMalloc(&y, size_t(maxT * s.out) * 4));
    cuda::fill_random_u32(nullptr, static_cast<uint32_t*>(w), words, 1);
    cuda::fill_random_bf16(nullptr, static_cast<uint16_t*>(sc), groups, 2, 0.01f, 0.03f, true);
    cuda::fill_random_bf16(nullptr, static_cast<uint16_t*>(bi), groups, 3, 0.0f, 0.05f, true);
    cuda::fill_random_f32(nullptr, static_cast<float*>(x), maxT * s.in, 4, -1.0f, 1.0f);
    cuda::QW q;
    q.w = w;
    q.s = static_cast<const uint16_t*>(sc);
    q.b = static_cast<const uint16_t*>(bi);
    q.out = s.out;
    q.in = s.in;
    q.bits = 4;
    q.gs = 64;
    for (int T : Ts) {
      if (T > maxT) continue;
      float* xp = static_cast<float*>(x);
      float* yp = static_cast<float*>(y);
      double gemv = 0.0, gemm = 0.0, f16 = 0.0, x2 = 0.0, wgm = 0.0, wg2 = 0.0, wgs = 0.0, q4 = 0.0, conv = 0.0;
      if (default_only) {
        q4 = median_ms([&] { cuda::linear_gemm(wg ? wctx : ctx, q, xp, yp, T); });
      } else {
        gemv = median_ms([&] { cuda::linear_gemv(ctx, q, xp, yp, T); });
        gemm = median_ms([&] { cuda::linear_gemm(ctx, q, xp, yp, T); });
        f16 = median_ms([&] { cuda::linear_gemm(fctx, q, xp, yp, T); });
        x2 = median_ms([&] { cuda::linear_gemm(pctx, q, xp, yp, T); });
      }
      if (wg && !default_only) {
        setenv("FERN_GEMM_WG_PIPE", "sync", 1);
        setenv("FERN_GEMM_WG_STAGES", "4", 1);  // the 64-token tiles in four stages, forced
        wgm = median_ms([&] { cuda::linear_gemm(wctx, q, xp, yp, T); });
        setenv("FERN_GEMM_WG_STAGES", "2", 1);  // the 64-token tiles in two stages, forced
        wg2 = median_ms([&] { cuda::linear_gemm(wctx, q, xp, yp, T); });
        unsetenv("FERN_GEMM_WG_STAGES");
        setenv("FERN_GEMM_WG_PIPE", "ws", 1);
        wgs = median_ms([&] { cuda::linear_gemm(wctx, q, xp, yp, T); });
        unsetenv("FERN_GEMM_WG_PIPE");  // the default: the exact-code loop for these 4-bit group-64 weights
        q4 = median_ms([&] { cuda::linear_gemm(wctx, q, xp, yp, T); });
        const cuda::X16 xs = cuda::xbf_carve(ws, T, s.in);
        conv = median_ms([&] { cuda::to_xbf(ctx, xp, T, s.in, xs); });
      }
      const double fl = 2.0 * T * s.out * s.in;
      auto tf = [&](double ms) { return ms > 0.0 ? fl / (ms * 1e-3) / 1e12 : 0.0; };
      std::printf(
          "| %s %ldx%ld | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx | %.1f | %.1f | %.1f "
          "| %.1f |\n",
          s.name, long(s.out), long(s.in), T, gemv, gemm, f16, x2, wgm, wg2, wgs, q4, conv, q4 > 0 ? gemm / q4 : 0.0,
          tf(gemm), tf(f16), tf(wgs), tf(q4));
      std::fflush(stdout);
    }
    for (void* p : {w, sc, bi, x, y}) FERN_CUDA_CHECK(cudaFree(p));
  }
  FERN_CUDA_CHECK(cudaFree(ws));
  return 0;
}
