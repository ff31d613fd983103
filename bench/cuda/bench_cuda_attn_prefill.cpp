// Attention prefill micro-benchmark (docs/notes/cuda-prefill-v2-attn.md): one layer's attention core at the real
// shapes (16 query heads, 2 KV heads, head dim 256) for a chunk of T rows starting at position pos, the decode
// kernel over T rows (the T > 1 path before the flash kernel) against the tensor-core flash kernel. The KV cache
// rows before pos and the inputs are random device fills. Each figure is the median of several launches (CUDA events,
// after one warm-up); attn_prep (norms, RoPE, KV append; the same for both) is timed on its own.
// Effective TFLOP/s counts 4 * D * Hq FLOPs per visible (query row, key) pair (q K^T and P V, 2 FLOPs per MAC).
// The two kernels' outputs are compared (NMSE of the flash output against the decode kernel's) at every point,
// which checks the flash kernel at cache lengths the CPU-referenced tests cannot reach. The last columns: the cache
// rows converted to fp16 once (cuda::kv_to_f16) and the kernel on those copies, which must give the same bits; the
// warpgroup-MMA kernel (attn_prefill_wg.cu, sm_90a only) with its copies, and its NMSE against the decode kernel, in
// its pipelined loop (docs/notes/cuda-prefill-v12-attn-pipe.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "cuda/attn_prefill.h"
#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/kernels.h"

using namespace fern;

namespace {
// The kernels run on the legacy default stream (a default cuda::Ctx).
double median_ms(const std::function<void()>& f, int reps = 7) { return bench::median_ms(nullptr, f, reps); }

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  FERN_CUDA_CHECK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace

int main() {
  cuda::AttnShape sh;
  sh.Hq = 16;
  sh.Hkv = 2;
  sh.D = 256;
  sh.rot = 64;
  sh.theta = 1e7f;
  sh.eps = 1e-6f;
  const int64_t kMaxPos = 126 * 1024;
  const int kMaxT = 2048;
  sh.capacity = kMaxPos + kMaxT;
  cuda::Ctx ctx;
  int dev = 0;
  FERN_CUDA_CHECK(cudaGetDevice(&dev));
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t row = int64_t(sh.Hkv) * sh.D;
  uint16_t *kc, *vc, *k16, *v16, *vt16;
  float *qg, *k, *v, *qn, *kn, *q, *o_old, *o_new, *pml, *pacc;
  int32_t* d_pos;
  const int64_t QG = int64_t(2) * sh.Hq * sh.D, O = int64_t(sh.Hq) * sh.D;
  const int decode_splits = cuda::attn_splits(sh.capacity);
  const size_t part_old = size_t(256) << 20;  // the backend's cap on the decode kernel's partials
  FERN_CUDA_CHECK(cudaMalloc(&kc, size_t(sh.capacity * row) * 2));
  FERN_CUDA_CHECK(cudaMalloc(&vc, size_t(sh.capacity * row) * 2));
  FERN_CUDA_CHECK(cudaMalloc(&k16, size_t(sh.capacity * row) * 2));
  FERN_CUDA_CHECK(cudaMalloc(&v16, size_t(sh.capacity * row) * 2));
  const int64_t ld_max = (sh.capacity + 63) / 64 * 64;
  FERN_CUDA_CHECK(cudaMalloc(&vt16, size_t(ld_max * row) * 2));
  const bool wg = cuda::attn_prefill_wg_ok(sh);
  FERN_CUDA_CHECK(cudaMalloc(&qg, size_t(kMaxT * QG) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&k, size_t(kMaxT * row) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&v, size_t(kMaxT * row) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&qn, size_t(sh.D) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&kn, size_t(sh.D) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&q, size_t(kMaxT * O) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&o_old, size_t(kMaxT * O) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&o_new, size_t(kMaxT * O) * 4));
  FERN_CUDA_CHECK(cudaMalloc(&pml, part_old));
  FERN_CUDA_CHECK(cudaMalloc(&pacc, part_old));
  FERN_CUDA_CHECK(cudaMalloc(&d_pos, 4));
  // Cached keys as attn_prep leaves them (RMS-normed rows of unit RMS), values of unit scale.
  cuda::fill_random_bf16(nullptr, kc, sh.capacity * row, 1, 0.0f, 1.7f, true);
  cuda::fill_random_bf16(nullptr, vc, sh.capacity * row, 2, 0.0f, 1.7f, true);
  cuda::fill_random_f32(nullptr, qg, kMaxT * QG, 3, -1.7f, 1.7f);
  cuda::fill_random_f32(nullptr, k, kMaxT * row, 4, -1.7f, 1.7f);
  cuda::fill_random_f32(nullptr, v, kMaxT * row, 5, -1.7f, 1.7f);
  cuda::fill_random_f32(nullptr, qn, sh.D, 6, 0.9f, 1.1f);
  cuda::fill_random_f32(nullptr, kn, sh.D, 7, 0.9f, 1.1f);

  struct Point {
    int64_t pos;
    int T;
  };
  std::vector<Point> pts;
  for (int64_t pos : {int64_t(0), int64_t(30 * 1024), kMaxPos}) pts.push_back({pos, 2048});
  for (int64_t pos : {int64_t(4096), int64_t(32 * 1024)})
    for (int T : {2, 3, 4, 8, 16, 32, 64, 256}) pts.push_back({pos, T});

  std::printf("| pos | T | prep (ms) | decode kernel (ms) | flash (ms) | flash splits | speed-up | flash TFLOP/s | "
              "NMSE flash vs decode | flash bf16 (ms) | NMSE bf16 vs decode | fp16 copies + flash (ms) | copies (ms) | "
              "same bits as flash | wg + copies (ms) | wg TFLOP/s | NMSE wg vs decode |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Point& p : pts) {
    const int T = p.T;
    const int32_t pos32 = static_cast<int32_t>(p.pos);
    FERN_CUDA_CHECK(cudaMemcpy(d_pos, &pos32, 4, cudaMemcpyHostToDevice));
    auto prep = [&] { cuda::attn_prep(ctx, sh, d_pos, qg, k, v, qn, kn, q, kc, vc, T); };
    prep();
    const int64_t per_split = int64_t(T) * sh.Hq * sh.D * 4;
    const int ns_old = static_cast<int>(std::clamp<int64_t>(int64_t(part_old) / per_split, 1, decode_splits));
    int ns_new = cuda::attn_prefill_splits(sh, p.pos, T, ctx.sms);
    ns_new = static_cast<int>(std::min<int64_t>(ns_new, (int64_t(64) << 20) / (int64_t(T) * sh.Hq * (sh.D + 2) * 4)));
    ns_new = std::max(ns_new, 1);
    const int reps = p.pos > 64 * 1024 ? 3 : 7;
    const double t_prep = median_ms(prep, 7);
    const double t_old = median_ms(
        [&] { cuda::attn_decode(ctx, sh, d_pos, q, qg, kc, vc, pml, pacc, o_old, T, ns_old); }, reps);
    const double t_new = median_ms(
        [&] { cuda::attn_prefill(ctx, sh, d_pos, q, qg, kc, vc, pml, pacc, o_new, T, ns_new); }, reps);
    FERN_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> ref = download(o_old, size_t(T * O));
    const std::vector<float> flash_out = download(o_new, size_t(T * O));
    const double e = nmse(flash_out, ref);
    // The cache rows converted to fp16 once (as the backend's flash-kv16 does per layer and chunk), then the kernel
    // without its own conversion: timed together, and the conversion alone.
    const int64_t rows = p.pos + T;
    auto copies = [&] { cuda::kv_to_f16(ctx, sh, d_pos, kc, vc, k16, v16, T, rows); };
    const double t_kv = median_ms(
        [&] {
          copies();
          cuda::attn_prefill(ctx, sh, d_pos, q, qg, k16, v16, pml, pacc, o_new, T, ns_new, true, true);
        },
        reps);
    const double t_copies = median_ms(copies, reps);
    FERN_CUDA_CHECK(cudaDeviceSynchronize());
    const bool same = download(o_new, size_t(T * O)) == flash_out;
    // The warpgroup-MMA kernel (sm_90a), its two copies included (keys as rows, values transposed).
    double t_wg = 0, e_wg = 0;
    if (wg) {
      const int64_t ld = (rows + 63) / 64 * 64;
      t_wg = median_ms(
          [&] {
            cuda::kv_to_f16(ctx, sh, d_pos, kc, nullptr, k16, nullptr, T, rows);
            cuda::v_to_f16_t(ctx, sh, d_pos, vc, vt16, T, ld);
            cuda::attn_prefill_wg(ctx, sh, d_pos, q, qg, k16, vt16, ld, pml, pacc, o_new, T, ns_new);
          },
          reps);
      FERN_CUDA_CHECK(cudaDeviceSynchronize());
      e_wg = nmse(download(o_new, size_t(T * O)), ref);
    }
    // The previous operand precision (bf16 q and softmax weights), for the notes' comparison.
    const double t_bf = median_ms(
        [&] { cuda::attn_prefill(ctx, sh, d_pos, q, qg, kc, vc, pml, pacc, o_new, T, ns_new, false); }, reps);
    FERN_CUDA_CHECK(cudaDeviceSynchronize());
    const double e_bf = nmse(download(o_new, size_t(T * O)), ref);
    double pairs = 0;
    for (int t = 0; t < T; ++t) pairs += double(p.pos + t + 1);
    const double flops = 4.0 * sh.D * sh.Hq * pairs;
    auto tflops = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
    std::printf("| %ld | %d | %.3f | %.3f | %.3f | %d | %.1fx | %.1f | %.2e | %.3f | %.2e | %.3f | %.3f | %s | %.3f | %.1f "
                "| %.2e |\n",
                long(p.pos), T, t_prep, t_old, t_new, ns_new, t_old / t_new, tflops(t_new), e, t_bf, e_bf, t_kv,
                t_copies, same ? "yes" : "NO", t_wg, tflops(t_wg), e_wg);
    std::fflush(stdout);
  }
  for (void* ptr : {static_cast<void*>(kc), static_cast<void*>(vc), static_cast<void*>(k16), static_cast<void*>(v16),
                    static_cast<void*>(vt16),
                    static_cast<void*>(qg), static_cast<void*>(k),
                    static_cast<void*>(v), static_cast<void*>(qn), static_cast<void*>(kn), static_cast<void*>(q),
                    static_cast<void*>(o_old), static_cast<void*>(o_new), static_cast<void*>(pml),
                    static_cast<void*>(pacc), static_cast<void*>(d_pos)})
    FERN_CUDA_CHECK(cudaFree(ptr));
  return 0;
}
