// Sparse MoE block for a chunk of T > 1 prompt rows (prefill). Shapes are checked by moe().
// Default path (moe_prefill.h): router logits on the tensor cores and top-k on the GPU, the pairs grouped by expert
// on the GPU, grouped tensor-core GEMMs for gate/up and down (the shared expert as one more group), a deterministic
// combine.
// Ablation switches (environment, read on every call so that a benchmark can flip them; default = fast path):
//   FERN_MOE_PATH=rows        the decode kernels over the rows (the path before the grouped GEMMs)
//   FERN_MOE_ROUTER=fused     the fused router GEMV of the decode path (cuda::moe_route) instead of the tensor cores
//   FERN_MOE_ROUTER=tiles|gemm  the router logits at every T by the 16-row tensor-core router kernel or by the dense
//                             linear's path (wgmma tiles where they run); unset: gemm from kRouterGemmMinRows rows
//                             on the wgmma loop, tiles otherwise
//   FERN_MOE_ROUTING=host     the top-k ids copied to the host, the grouping built there and uploaded
//   FERN_MOE_TILE=fixed|16|32|64|96|128|adaptive   token rows per GEMM tile (fixed = 64; 96 and 128 on the
//                             exact-code wgmma loop only; adaptive, the default, from the mean rows per expert, see
//                             tile_rows)
//   FERN_MOE_TAIL=0           no 144-token passes: a group's rows past a multiple of 128 always take a tile of
//                             their own (the default takes up to 16 of them into the last 128-row tile)
//   FERN_MOE_DEQUANT=separate the chunk's expert matrices dequantized to a bf16 scratch first, then the bf16 GEMMs
//   FERN_MOE_PREFETCH=1       the tile loop issues the next k tile's global loads before the current tile's MMAs
//                             (measured slower at every tile height: docs/notes/cuda-prefill-v2-moe.md)
//   FERN_GEMM=split|fp16|fp16x2|wg  the tile loop of the grouped GEMMs (cuda::gemm_mode, gemm_f16.h; default wg
//                             where it runs, else split): split the bf16 hi/lo loop of gemm_tile.cuh; fp16 and
//                             fp16x2 the pipelined loop of gemm_tile_f16.cuh on x and h converted once per chunk to
//                             fp16 rows (4/8-bit experts; fp16 rounds x and the weights to fp16, fp16x2 keeps
//                             split's precision; docs/notes/cuda-prefill-v3-gemm.md); wg the wgmma loop of
//                             gemm_tile_wg.cuh on bf16 hi/lo rows (sm_90a; docs/notes/cuda-prefill-v4-wg.md).
//                             FERN_MOE_DEQUANT=separate and FERN_MOE_PREFETCH=1 take split.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "cuda/backend_internal.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_wg.h"
#include "cuda/moe_prefill.h"

namespace fern {
using namespace cuda_backend_detail;

namespace {


// Rows from which the router logits take the dense linear's path when that is the wgmma loop (bench_cuda_moe_prefill,
// the MoE block on the H200, thirteenth session: 0.690 vs 0.666 ms at T = 512, 1.122 vs 1.131 at 2,048, 3.425 vs
// 3.505 at 8,192; whole prefill +1.2% at 4K, +0.8% at 32K, +0.4% at 128K). Without wgmma (the split loop's 64-row
// tiles) it was not measured, so the 16-row router kernel stays.
constexpr int kRouterGemmMinRows = 2048;

enum class RouterForm { Tiles, Gemm, Fused };
RouterForm router_form(int T) {
  const int forced = env_choice("FERN_MOE_ROUTER", {"tiles", "gemm", "fused"}, -1);
  if (forced >= 0) return static_cast<RouterForm>(forced);
  return T >= kRouterGemmMinRows && cuda::gemm_mode() == cuda::GemmMode::Wg ? RouterForm::Gemm : RouterForm::Tiles;
}

// Token rows per tile. A tile costs its full height in MMAs whatever rows it holds, and each tile stages the
// expert's weights once, so short tiles waste fewer MMAs on experts with few rows and tall tiles re-stage the
// weights less often. The row counts are on the GPU (reading them would be a host round trip), so the choice is
// made from their mean m = T k / E. Measured on the H200 at the real shape (docs/notes/cuda-prefill-v2-moe.md):
// m = 16 (T = 512): 32 rows 1.12 ms, 16 rows 1.24, 64 rows 1.57; m = 64 (T = 2048): 64 rows 2.98 ms, 32 rows 3.16,
// 16 rows 3.95. Hence 32 up to m = 32 and 64 above (the switch point between the two measured means is a guess);
// 16 only for m <= 4 (short chunks: most experts hold one or two rows, and 16-row tiles issue half the MMAs of
// 32-row ones for the same weight reads; not measured). With the exact-code wgmma loop (q4: both GEMMs on it),
// 96-row tiles from m = 48: at m = 64 an expert's rows (about 64 +- 8 with even routing) then fit one tile instead
// of two mostly empty ones (docs/notes/cuda-prefill-v5-ws.md); 128-row tiles from m = 128 (fewer passes over each
// expert's weights; docs/notes/cuda-prefill-v15-moe-tile128.md: the MoE block at T = 8,192 3.30 vs 3.39 ms, whole
// prefill +1.1% at 4K (m = 128) and +1.8% at 32K (m = 256); at m = 64 they lose, 1.28 vs 1.12 ms).
int tile_rows(int T, int k, int E, bool q4) {
  const char* v = std::getenv("FERN_MOE_TILE");
  if (v != nullptr && std::strcmp(v, "adaptive") != 0) {
    if (std::strcmp(v, "fixed") == 0) return 64;
    const int bm = std::atoi(v);
    if ((bm == 96 || bm == 128) && !q4)
      fail("FERN_MOE_TILE={}: only the exact-code wgmma loop takes {}-row tiles (FERN_GEMM=wg, "
           "FERN_GEMM_WG_PIPE=q4b, q4 or q4h, 4-bit experts with groups a multiple of 64)", v, bm);
    if (!cuda::moe_tile_rows_wg_ok(bm, q4))
      fail("FERN_MOE_TILE={}: expected fixed, adaptive, 16, 32, 64, 96 or 128", v);
    return bm;
  }
  const double mean = double(T) * k / E;
  if (q4 && mean >= 128) return 128;
  return mean <= 4 ? 16 : mean <= 32 ? 32 : (q4 && mean >= 48) ? 96 : 64;
}

// The grouping of moe_prefill.h built on the host from the downloaded top-k ids (ablation: the host round trip).
// Pairs inside a group keep token order.
void group_on_host(cudaStream_t stream, const int32_t* d_ids, int T, int k, int E, int bm, const cuda::MoeGroups& g) {
  const int P = T * k;
  std::vector<int32_t> ids(size_t(P), 0);
  FERN_CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_ids, sizeof(int32_t) * P, cudaMemcpyDeviceToHost, stream));
  FERN_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<int32_t> counts(size_t(E) + 1, 0), offsets(size_t(E) + 1, 0), tiles;
  std::vector<int32_t> order(static_cast<size_t>(P), 0);
  for (int32_t& e : ids) {
    e = std::clamp(e, 0, E - 1);
    ++counts[size_t(e)];
  }
  for (int e = 1; e < E; ++e) offsets[size_t(e)] = offsets[size_t(e) - 1] + counts[size_t(e) - 1];
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  for (int p = 0; p < P; ++p) order[size_t(fill[size_t(ids[size_t(p)])]++)] = p;
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < cuda::moe_group_tiles(counts[size_t(e)], bm, g.extra); ++j) tiles.insert(tiles.end(), {e, j * bm});
  for (int j = 0; j < cuda::moe_group_tiles(T, bm, g.extra); ++j) tiles.insert(tiles.end(), {E, j * bm});
  counts[size_t(E)] = T;
  const int32_t n_tiles = static_cast<int32_t>(tiles.size() / 2);
  auto up = [&](int32_t* dst, const void* src, size_t n) {
    FERN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  };
  up(g.counts, counts.data(), counts.size());
  up(g.offsets, offsets.data(), offsets.size());
  up(g.order, order.data(), order.size());
  up(g.tiles, tiles.data(), tiles.size());
  up(g.n_tiles, &n_tiles, 1);
  FERN_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host vectors die here
}

}  // namespace

bool CudaBackend::moe_prefill_(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg,
                               const MoeInNorm* norm) {
  const int T = static_cast<int>(x.dim(0));
  const int k = cfg.num_experts_per_tok;
  const int64_t E = w.router.out, H = w.gate.in, I = w.gate.out, Is = w.shared_gate.out;
  cuda::QW gate = cuda::make_qw(w.gate), up = cuda::make_qw(w.up), down = cuda::make_qw(w.down);
  cuda::QW sgate = cuda::make_qw(w.shared_gate), sup = cuda::make_qw(w.shared_up), sdown = cuda::make_qw(w.shared_down);
  cuda::MoeScratch s;
  s.router_logits = scratch(DType::F32, {T, E}).ptr<float>();
  s.sgate_logit = scratch(DType::F32, {T}).ptr<float>();
  s.topk_ids = scratch(DType::I32, {T, k}).ptr<int32_t>();
  s.topk_w = scratch(DType::F32, {T, k}).ptr<float>();
  s.sgate = scratch(DType::F32, {T}).ptr<float>();
  float* const xp = f32(x, "moe x");  // written here too when the block computes its input (norm)
  float* op = f32(out, "moe out");
  float* const resid = norm != nullptr ? norm->resid : nullptr;  // resid += out in the combine's pass

  const bool grouped =
      env_choice("FERN_MOE_PATH", {"grouped", "rows"}, 0) == 0 && cuda::moe_grouped_ok(gate, up, down, sgate, sup, sdown);
  const bool prefetch = env_choice("FERN_MOE_PREFETCH", {"0", "1"}, 0) == 1;
  const cuda::GemmMode mode = cuda::gemm_mode();
  const bool separate = env_choice("FERN_MOE_DEQUANT", {"fused", "separate"}, 0) == 1 && gate.bits != 16;
  // The wgmma loops (FERN_MOE_DEQUANT=separate and FERN_MOE_PREFETCH=1 take split); the exact-code one is decided
  // per GEMM (its own row layout for x and h), and both GEMMs on it allow the tile heights it alone takes.
  const bool wg = mode == cuda::GemmMode::Wg && !prefetch && !separate && cuda::moe_grouped_wg_ok(gate, down, sdown);
  const cuda::WgPipe pipe = cuda::gemm_wg_pipe();
  const bool q4_pipe = wg && cuda::gemm_pipe_q4(pipe);
  const bool q4_gate_up = q4_pipe && cuda::moe_grouped_q4_ok(gate, up, sgate, sup);
  const bool q4_down = q4_pipe && cuda::moe_grouped_q4_ok(down, sdown, down, sdown);

  // The input from the residual (moe_residual): resid += delta, x = rmsnorm(resid), straight into gate/up's
  // exact-code rows as well where that loop takes them (FERN_CUDA_NORM_ROWS=fused, the default; the fp32 rows are
  // still written: the router and the shared gate read them), else add_rmsnorm. Same bits either way.
  // The router's GEMM on its plain bf16 hi/lo rows (an 8-bit router on the wgmma loop): written by the same pass
  // (FERN_CUDA_NORM_ROWS=fused) instead of by to_xbf after it.
  const cuda::QW router = cuda::make_qw(w.router), seg = cuda::make_qw(w.shared_expert_gate);
  const RouterForm rf = router_form(T);
  const bool router_gemm = rf == RouterForm::Gemm && router.experts == 0 && cuda::moe_route_topk_ok(router.out, k);
  // Rows of n x K for the wgmma loops in scratch: the exact-code loop's (q4, in the pipe's form) or plain bf16 hi/lo.
  auto xbf_rows = [&](int64_t n, int64_t K, bool q4) {
    void* ws = scratch(DType::F32, {int64_t((cuda::xbf_bytes(n, K) + 3) / 4)}).data;
    return cuda::xbf_carve(ws, n, K, q4, pipe == cuda::WgPipe::Q4h, pipe == cuda::WgPipe::Q4b);
  };
  std::optional<cuda::X16> x_rows, router_rows;
  if (norm != nullptr) {
    if (grouped && q4_gate_up && cuda::rmsnorm_xbf_q4_ok(H) &&
        env_choice("FERN_CUDA_NORM_ROWS", {"fused", "separate"}, 0) == 0) {
      x_rows = xbf_rows(T, H, true);
      if (router_gemm && cuda::linear_gemm_takes_plain_rows(router, T)) router_rows = xbf_rows(T, H, false);
      cuda::rmsnorm_xbf_q4(ctx(), nullptr, norm->resid, norm->delta, norm->w, norm->eps, xp, T, H, *x_rows,
                           router_rows ? &*router_rows : nullptr);
    } else {
      cuda::add_rmsnorm(ctx(), norm->resid, norm->delta, xp, norm->w, T, static_cast<int>(H), norm->eps);
    }
  }

  if (!grouped) {
    // The decode kernels over the T rows (each row re-reads its experts' weights).
    s.h = scratch(DType::F32, {T, k * I + Is}).ptr<float>();
    cuda::moe_route(ctx(kMoeCounterBase, kCounters - kMoeCounterBase), router, seg, xp, s, T, k);
    cuda::moe_gate_up(ctx(), gate, up, sgate, sup, xp, s, T, k);
    cuda::moe_down(ctx(), down, sdown, s, op, T, k);
    return false;
  }

  s.h = nullptr;  // the grouped path keeps its intermediates in expert order (below)
  // The tensor-core router measured 0.064 vs 0.166 ms at T = 512 and 0.088 vs 0.636 ms at 2048 (the GEMV re-reads
  // the router for every row). From kRouterGemmMinRows the logits take the dense linear's path instead (the wgmma
  // tile loop on bf16 hi/lo rows where it runs: 128-row token tiles, where the router kernel's 16-row tiles
  // dequantize the router once per 16 rows).
  if (router_gemm) {
    if (router_rows)
      cuda::linear_gemm_wg_multi(ctx(), &router, &s.router_logits, 1, *router_rows, T);
    else
      linear_rows(ctx(), router, xp, s.router_logits, T);
    cuda::moe_route_topk(ctx(), seg, xp, s, static_cast<int>(E), T, k);
  } else if (rf == RouterForm::Fused || !cuda::moe_route_gemm(ctx(), router, seg, xp, s, T, k)) {
    cuda::moe_route(ctx(kMoeCounterBase, kCounters - kMoeCounterBase), router, seg, xp, s, T, k);
  }

  const int Ei = static_cast<int>(E);
  const int bm = tile_rows(T, k, Ei, q4_gate_up && q4_down);
  cuda::MoeGroups g;
  g.counts = scratch(DType::I32, {E + 1}).ptr<int32_t>();
  g.offsets = scratch(DType::I32, {E + 1}).ptr<int32_t>();
  g.order = scratch(DType::I32, {int64_t(T) * k}).ptr<int32_t>();
  g.tiles = scratch(DType::I32, {2 * cuda::moe_max_tiles(T, k, Ei, bm)}).ptr<int32_t>();
  g.n_tiles = scratch(DType::I32, {1}).ptr<int32_t>();
  // A group's last 128-row tile takes up to kMoeTailRows more rows on the q4b loop (both GEMMs on it).
  g.extra = cuda::moe_tail_rows(bm, q4_gate_up && q4_down && pipe == cuda::WgPipe::Q4b);
  if (env_choice("FERN_MOE_ROUTING", {"gpu", "host"}, 0) == 1)
    group_on_host(stream(), s.topk_ids, T, k, Ei, bm, g);
  else
    cuda::moe_group(ctx(), s.topk_ids, T, k, Ei, bm, g);

  if (separate) {
    // Every matrix of the block as bf16 in scratch ([experts, out, in], the dense layout), then the bf16 GEMMs.
    auto to_bf16 = [&](cuda::QW& q) {
      uint16_t* d = scratch(DType::BF16, {std::max<int64_t>(q.experts, 1), q.out, q.in}).ptr<uint16_t>();
      cuda::moe_dequant_bf16(ctx(), q, d);
      q.w = d;
      q.s = q.b = nullptr;
      q.bits = 16;
      q.gs = 0;
      q.w_expert = q.out * q.in;
      q.sb_expert = 0;
    };
    for (cuda::QW* q : {&gate, &up, &down, &sgate, &sup, &sdown}) to_bf16(*q);
  }

  float* h_routed = scratch(DType::F32, {int64_t(T) * k, I}).ptr<float>();
  float* h_shared = scratch(DType::F32, {T, Is}).ptr<float>();
  float* y_pair = scratch(DType::F32, {int64_t(T) * k, H}).ptr<float>();
  const bool f16 = !wg && cuda::gemm_f16_format_ok(gate) && !prefetch &&
                   (mode == cuda::GemmMode::Fp16 || mode == cuda::GemmMode::Fp16x2);
  if (wg || f16) {
    // x converted once (bf16 hi/lo rows for wg, gemm_wg.h; fp16 rows for fp16/fp16x2, gemm_f16.h), gate/up, h
    // converted once the same way, down (docs/notes/cuda-prefill-v3-gemm.md, cuda-prefill-v4-wg.md).
    const bool precise = mode == cuda::GemmMode::Fp16x2;
    auto rows = [&](const float* src, int64_t n, int64_t K, bool q4) {
      cuda::X16 r;
      if (wg)
        r = xbf_rows(n, K, q4);
      else
        r = cuda::x16_carve(scratch(DType::F32, {int64_t((cuda::x16_bytes(n, K, precise) + 3) / 4)}).data, n, K, precise);
      if (q4)
        cuda::to_xbf_q4(ctx(), src, n, K, r);
      else if (wg)
        cuda::to_xbf(ctx(), src, n, K, r);
      else
        cuda::to_x16(ctx(), src, n, K, r);
      return r;
    };
    const cuda::X16 xs = x_rows ? *x_rows : rows(xp, T, H, q4_gate_up);
    (wg ? cuda::moe_grouped_gate_up_wg : cuda::moe_grouped_gate_up_f16)(ctx(), gate, up, sgate, sup, xs, g, T, k, Ei,
                                                                        bm, h_routed, h_shared);
    const cuda::X16 hrs = rows(h_routed, int64_t(T) * k, I, q4_down), hss = rows(h_shared, T, Is, q4_down);
    (wg ? cuda::moe_grouped_down_wg : cuda::moe_grouped_down_f16)(ctx(), down, sdown, hrs, hss, g, s.topk_w, s.sgate,
                                                                  T, k, Ei, bm, y_pair, op);
    cuda::moe_combine(ctx(), y_pair, op, T, k, H, resid);
    return resid != nullptr;
  }
  cuda::moe_grouped_gate_up(ctx(), gate, up, sgate, sup, xp, g, T, k, Ei, bm, prefetch, h_routed, h_shared);
  cuda::moe_grouped_down(ctx(), down, sdown, h_routed, h_shared, g, s.topk_w, s.sgate, T, k, Ei, bm, prefetch, y_pair,
                         op);
  cuda::moe_combine(ctx(), y_pair, op, T, k, H, resid);
  return resid != nullptr;
}

}  // namespace fern
