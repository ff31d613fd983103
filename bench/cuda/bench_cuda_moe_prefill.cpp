// MoE prefill micro-benchmark (docs/notes/cuda-prefill-v2-moe.md, cuda-prefill-v3-gemm.md): the backend's moe()
// for one chunk of T token rows at the real shape (256 experts top-8, H 2048, I 512, shared 512, 4-bit group 64
// experts, 8-bit router and shared gate), under each ablation switch of backend_moe_prefill.cpp (FERN_GEMM=fp16:
// the fp16 tile loop instead of the precise one), and the row-by-row decode kernels (the path before the grouped
// GEMMs); then the phases one at a time, for both tile loops. Weights and activations are random device fills (roughly balanced routing);
// each figure is the median of 7 timed calls (CUDA events on the backend's stream, after one warm-up), routing
// included. Effective TFLOP/s counts the useful products only: 2 T (3 k H I + 3 H Is).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_backend_impl.h"
#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/moe_prefill.h"
#include "cuda/qweight.h"
#include "cuda/random_weights.h"
#include "model/config.h"
#include "model/weights.h"

using namespace fern;
using bench::median_ms;

namespace {

LinearWeight affine(CudaBackend& be, const char* name, int64_t experts, int64_t out, int64_t in, int bits,
                    uint64_t& seed) {
  return cuda::random_device_affine(be, name, experts, out, in, bits, seed);
}

void set_env(const char* name, const char* value) {
  if (value != nullptr)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

}  // namespace

int main() {
  CudaBackend be(0);
  ModelConfig cfg;
  cfg.num_experts = 256;
  cfg.num_experts_per_tok = 8;
  cfg.hidden_size = 2048;
  cfg.moe_intermediate_size = 512;
  cfg.shared_expert_intermediate_size = 512;
  const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.moe_intermediate_size,
                Is = cfg.shared_expert_intermediate_size;
  const int k = cfg.num_experts_per_tok;
  uint64_t seed = 1;
  MoeWeights w;
  w.router = affine(be, "router", 0, E, H, 8, seed);
  w.gate = affine(be, "gate", E, I, H, 4, seed);
  w.up = affine(be, "up", E, I, H, 4, seed);
  w.down = affine(be, "down", E, H, I, 4, seed);
  w.shared_gate = affine(be, "shared_gate", 0, Is, H, 4, seed);
  w.shared_up = affine(be, "shared_up", 0, Is, H, 4, seed);
  w.shared_down = affine(be, "shared_down", 0, H, Is, 4, seed);
  w.shared_expert_gate = affine(be, "shared_expert_gate", 0, 1, H, 8, seed);

  struct Variant {
    const char* name;
    const char* path;
    const char* routing;
    const char* tile;
    const char* dequant;
    const char* prefetch;
    const char* router = nullptr;
    const char* gemm = nullptr;
    const char* wg_stages = nullptr;  // FERN_GEMM_WG_STAGES
    const char* wg_pipe = nullptr;    // FERN_GEMM_WG_PIPE
  };
  // The default tile loop is wg where the GPU and build run it (gemm_wg.h), else split.
  const Variant variants[] = {
      {"row-by-row decode kernels (before)", "rows", nullptr, nullptr, nullptr, nullptr},
      {"grouped, default (tensor-core router, GPU grouping, adaptive tile, default tile loop)", nullptr, nullptr,
       nullptr, nullptr, nullptr},
      {"grouped, FERN_GEMM=split (precise mma.sync loop, adaptive tile)", nullptr, nullptr, nullptr, nullptr, nullptr,
       nullptr, "split"},
      {"grouped, split, FERN_MOE_TILE=fixed (64)", nullptr, nullptr, "fixed", nullptr, nullptr, nullptr, "split"},
      {"grouped, FERN_GEMM=fp16 (the fp16 tile loop, adaptive tile)", nullptr, nullptr, nullptr, nullptr, nullptr,
       nullptr, "fp16"},
      {"grouped, FERN_GEMM=fp16x2 (precise pipelined loop, adaptive tile)", nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, "fp16x2"},
      {"grouped, FERN_GEMM_WG_PIPE=ws (warp-specialized hi/lo wgmma loop)", nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, "ws"},
      {"grouped, FERN_GEMM_WG_PIPE=sync (synchronous wgmma loop, its stage rule)", nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, "sync"},
      {"grouped, wg sync, FERN_GEMM_WG_STAGES=2 (two blocks per SM)", nullptr, nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, "2", "sync"},
      {"grouped, wg sync, FERN_GEMM_WG_STAGES=4 (deep pipeline)", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
       nullptr, "4", "sync"},
      {"grouped, default, FERN_MOE_TILE=16", nullptr, nullptr, "16", nullptr, nullptr},
      {"grouped, default, FERN_MOE_TILE=32", nullptr, nullptr, "32", nullptr, nullptr},
      {"grouped, default, FERN_MOE_TILE=fixed (64)", nullptr, nullptr, "fixed", nullptr, nullptr},
      {"grouped, default, FERN_MOE_TILE=96", nullptr, nullptr, "96", nullptr, nullptr},
      {"grouped, default, FERN_MOE_TILE=128 (exact-code loop; adaptive from 128 rows per expert)", nullptr, nullptr,
       "128", nullptr, nullptr},
      {"grouped, FERN_MOE_ROUTER=fused (router GEMV)", nullptr, nullptr, nullptr, nullptr, nullptr, "fused"},
      {"grouped, FERN_MOE_ROUTER=tiles (16-row router kernel at every T)", nullptr, nullptr, nullptr, nullptr, nullptr,
       "tiles"},
      {"grouped, FERN_MOE_ROUTER=gemm (router logits on the dense GEMM path at every T)", nullptr, nullptr, nullptr,
       nullptr, nullptr, "gemm"},
      {"grouped, FERN_MOE_ROUTING=host", nullptr, "host", nullptr, nullptr, nullptr},
      {"grouped, FERN_MOE_DEQUANT=separate (split loop on bf16 copies)", nullptr, nullptr, nullptr, "separate",
       nullptr},
      {"grouped, FERN_MOE_PREFETCH=1 (split loop, adaptive tile)", nullptr, nullptr, nullptr, nullptr, "1"},
  };
  const std::vector<int> Ts = bench::bench_rows({512, 2048, 8192});
  const int maxT = *std::max_element(Ts.begin(), Ts.end());
  Tensor x = be.alloc(DType::F32, {maxT, H});
  Tensor y = be.alloc(DType::F32, {maxT, H});
  cuda::fill_random_f32(be.stream(), x.ptr<float>(), x.numel(), 99, -1.7f, 1.7f);  // unit variance
  FERN_CUDA_CHECK(cudaStreamSynchronize(be.stream()));

  std::printf("| T | variant | ms | effective TFLOP/s | speed-up vs row-by-row |\n|---:|---|---:|---:|---:|\n");
  for (int T : Ts) {
    const double flops = 2.0 * T * (3.0 * k * H * I + 3.0 * H * Is);
    Tensor xt(x.data, DType::F32, {T, H}, Device::Cuda);
    Tensor yt(y.data, DType::F32, {T, H}, Device::Cuda);
    double base = 0.0;
    for (const Variant& v : variants) {
      // FERN_BENCH_DEFAULT_ONLY=1: the default variant alone (comparing builds in one short GPU call).
      const char* only = std::getenv("FERN_BENCH_DEFAULT_ONLY");
      if (only != nullptr && only[0] == '1' && &v != &variants[1]) continue;
      set_env("FERN_MOE_PATH", v.path);
      set_env("FERN_MOE_ROUTING", v.routing);
      set_env("FERN_MOE_TILE", v.tile);
      set_env("FERN_MOE_DEQUANT", v.dequant);
      set_env("FERN_MOE_PREFETCH", v.prefetch);
      set_env("FERN_MOE_ROUTER", v.router);
      set_env("FERN_GEMM", v.gemm);
      set_env("FERN_GEMM_WG_STAGES", v.wg_stages);
      set_env("FERN_GEMM_WG_PIPE", v.wg_pipe);
      const double ms = median_ms(be.stream(), [&] {
        be.begin_forward();
        be.moe(yt, xt, w, cfg);
      });
      if (v.path != nullptr) base = ms;
      std::printf("| %d | %s | %.3f | %.1f | %.1fx |\n", T, v.name, ms, flops / (ms * 1e-3) / 1e12,
                  base > 0 ? base / ms : 0.0);
      std::fflush(stdout);
    }
  }

  // Phase breakdown (the same launches as moe_prefill_, timed one phase at a time), for both tile loops; the fp16
  // loop's two conversions (x before gate/up, h before down) have their own columns.
  std::printf(
      "\n| T | tile rows | loop | route (GEMV) | route (tiles) | group | x to fp16 | gate/up | h to fp16 | down "
      "| combine | gate/up TFLOP/s | down TFLOP/s |\n"
      "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  Tensor counters = be.alloc(DType::I32, {maxT});
  FERN_CUDA_CHECK(cudaMemset(counters.data, 0, size_t(maxT) * 4));
  cuda::Ctx c;
  c.stream = be.stream();
  c.sms = be.sm_count();
  c.pdl = be.pdl();
  cuda::Ctx rc = c;
  rc.counters = counters.ptr<int>();
  rc.n_counters = maxT;
  const cuda::QW qg = cuda::make_qw(w.gate), qu = cuda::make_qw(w.up), qd = cuda::make_qw(w.down);
  const cuda::QW qsg = cuda::make_qw(w.shared_gate), qsu = cuda::make_qw(w.shared_up);
  const cuda::QW qsd = cuda::make_qw(w.shared_down);
  auto buf = [&](DType t, int64_t n) { return be.alloc(t, {n}).data; };
  cuda::MoeScratch s;
  s.router_logits = static_cast<float*>(buf(DType::F32, maxT * E));
  s.sgate_logit = static_cast<float*>(buf(DType::F32, maxT));
  s.topk_ids = static_cast<int32_t*>(buf(DType::I32, maxT * k));
  s.topk_w = static_cast<float*>(buf(DType::F32, maxT * k));
  s.sgate = static_cast<float*>(buf(DType::F32, maxT));
  s.h = nullptr;
  float* h_routed = static_cast<float*>(buf(DType::F32, maxT * k * I));
  float* h_shared = static_cast<float*>(buf(DType::F32, maxT * Is));
  float* y_pair = static_cast<float*>(buf(DType::F32, maxT * k * H));
  auto carve = [&](int64_t rows, int64_t K, bool precise) {
    return cuda::x16_carve(buf(DType::F32, int64_t(cuda::x16_bytes(rows, K, precise) / 4 + 1)), rows, K, precise);
  };
  const cuda::X16 xsf[2] = {carve(maxT, H, false), carve(maxT, H, true)};
  const cuda::X16 hrsf[2] = {carve(maxT * k, I, false), carve(maxT * k, I, true)};
  const cuda::X16 hssf[2] = {carve(maxT, Is, false), carve(maxT, Is, true)};
  for (int T : Ts) {
    for (int v = 0; v < 9; ++v) {
      const int bm = 16 << (v / 3);
      const int loop = v % 3;  // split, fp16, fp16x2
      const bool f16 = loop != 0;
      const cuda::X16& xs = xsf[loop == 2];
      const cuda::X16& hrs = hrsf[loop == 2];
      const cuda::X16& hss = hssf[loop == 2];
      cuda::MoeGroups g;
      g.counts = static_cast<int32_t*>(buf(DType::I32, E + 1));
      g.offsets = static_cast<int32_t*>(buf(DType::I32, E + 1));
      g.order = static_cast<int32_t*>(buf(DType::I32, int64_t(T) * k));
      g.tiles = static_cast<int32_t*>(buf(DType::I32, 2 * cuda::moe_max_tiles(T, k, int(E), bm)));
      g.n_tiles = static_cast<int32_t*>(buf(DType::I32, 1));
      const float* xp = x.ptr<float>();
      float* yp = y.ptr<float>();
      const double t_route = median_ms(c.stream, [&] {
        cuda::moe_route(rc, cuda::make_qw(w.router), cuda::make_qw(w.shared_expert_gate), xp, s, T, k);
      });
      const double t_route_gemm = median_ms(c.stream, [&] {
        cuda::moe_route_gemm(c, cuda::make_qw(w.router), cuda::make_qw(w.shared_expert_gate), xp, s, T, k);
      });
      const double t_group = median_ms(c.stream, [&] { cuda::moe_group(c, s.topk_ids, T, k, int(E), bm, g); });
      double t_cx = 0.0, t_ch = 0.0, t_gu, t_down;
      if (f16) {
        t_cx = median_ms(c.stream, [&] { cuda::to_x16(c, xp, T, H, xs); });
        t_gu = median_ms(c.stream, [&] {
          cuda::moe_grouped_gate_up_f16(c, qg, qu, qsg, qsu, xs, g, T, k, int(E), bm, h_routed, h_shared);
        });
        t_ch = median_ms(c.stream, [&] {
          cuda::to_x16(c, h_routed, int64_t(T) * k, I, hrs);
          cuda::to_x16(c, h_shared, T, Is, hss);
        });
        t_down = median_ms(c.stream, [&] {
          cuda::moe_grouped_down_f16(c, qd, qsd, hrs, hss, g, s.topk_w, s.sgate, T, k, int(E), bm, y_pair, yp);
        });
      } else {
        t_gu = median_ms(c.stream, [&] {
          cuda::moe_grouped_gate_up(c, qg, qu, qsg, qsu, xp, g, T, k, int(E), bm, false, h_routed, h_shared);
        });
        t_down = median_ms(c.stream, [&] {
          cuda::moe_grouped_down(c, qd, qsd, h_routed, h_shared, g, s.topk_w, s.sgate, T, k, int(E), bm, false,
                                 y_pair, yp);
        });
      }
      const double t_comb = median_ms(c.stream, [&] { cuda::moe_combine(c, y_pair, yp, T, k, H); });
      const double f_gu = 2.0 * T * (2.0 * k * H * I + 2.0 * H * Is), f_down = 2.0 * T * (k * H * I + H * Is);
      std::printf("| %d | %d | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %.1f |\n", T, bm,
                  loop == 0 ? "split" : loop == 1 ? "fp16" : "fp16x2", t_route, t_route_gemm, t_group, t_cx, t_gu, t_ch, t_down, t_comb,
                  f_gu / (t_gu * 1e-3) / 1e12, f_down / (t_down * 1e-3) / 1e12);
      std::fflush(stdout);
    }
  }
  return 0;
}
