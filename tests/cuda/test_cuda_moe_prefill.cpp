// CUDA MoE for T > 1 rows (the grouped tensor-core paths of moe_prefill.cu and, with FERN_GEMM=fp16,
// moe_prefill_f16.cu, and the other ablation switches) against the
// CPU backend: real shapes (256 experts top-8, H 2048, I 512, shared 512, 4-bit group 64, 8-bit router) at
// T = 2 ... 2048, awkward shapes (6 experts top-2, I 96, group 32), a router biased so that one expert gets every
// row and another none, 8-bit and bf16 experts, and a shape the grouped path refuses (it must fall back).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cuda/gemm_wg.h"
#include "cuda/moe_prefill.h"
#include "cuda/qweight.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

struct Shape {
  const char* name;
  int64_t E, H, I, Is;
  int k, bits, gs;
};


// One MoE block's weights on both sides. bias_router: router row 0 gets a large positive bias and row E-1 a large
// negative one, so that with inputs of positive mean every token picks expert 0 and none picks expert E-1.
struct Model {
  test::OwnedStorage st;
  MoeWeights host, dev;
  ModelConfig cfg;
};

std::unique_ptr<Model> make_model(CudaBackend& gpu, const Shape& s, uint64_t seed, bool bias_router) {
  auto m = std::make_unique<Model>();
  const int gbits = s.bits == 16 ? 16 : 8;
  m->host = test::random_moe(m->st, s.E, s.H, s.I, s.Is, s.bits, s.gs, gbits, seed);
  MoeWeights& w = m->host;
  if (bias_router) {
    // The router's scales are cut tenfold (a spread of the other logits below one unit at the real shape: with the
    // original scales it was ~7.5, and one token in 2048 then missed expert 0), then each row's biases centre its
    // codes (b = -127.5 s, so that inputs of positive mean add no row-dependent shift), and row 0 gets +delta and
    // row E-1 -delta per group: a logit shift of +-delta * sum_k x_k = +-30 for inputs of mean 0.5.
    EXPECT_EQ(gbits, 8);
    const int64_t ng = s.H / 64;
    const float delta = 30.0f / (0.5f * float(s.H));
    uint16_t* sc = w.router.scales.ptr<uint16_t>();
    uint16_t* b = w.router.biases.ptr<uint16_t>();
    for (int64_t e = 0; e < s.E; ++e)
      for (int64_t j = 0; j < ng; ++j) {
        const float scale = 0.1f * bf16_to_f32(sc[e * ng + j]);
        const float shift = e == 0 ? delta : e == s.E - 1 ? -delta : 0.0f;
        sc[e * ng + j] = f32_to_bf16(scale);
        b[e * ng + j] = f32_to_bf16(-127.5f * bf16_to_f32(sc[e * ng + j]) + shift);
      }
  }
  m->dev = test::to_device(gpu, w);
  m->cfg.num_experts = static_cast<int>(s.E);
  m->cfg.num_experts_per_tok = s.k;
  m->cfg.hidden_size = static_cast<int>(s.H);
  m->cfg.moe_intermediate_size = static_cast<int>(s.I);
  m->cfg.shared_expert_intermediate_size = static_cast<int>(s.Is);
  return m;
}

bool grouped_ok(const Model& m) {
  const MoeWeights& d = m.dev;
  return cuda::moe_grouped_ok(cuda::make_qw(d.gate), cuda::make_qw(d.up), cuda::make_qw(d.down),
                              cuda::make_qw(d.shared_gate), cuda::make_qw(d.shared_up), cuda::make_qw(d.shared_down));
}

std::vector<float> inputs(const Model& m, int T, uint64_t seed, float mean) {
  auto x = test::randn(size_t(T) * size_t(m.cfg.hidden_size), seed);
  for (float& v : x) v += mean;
  return x;
}

std::vector<float> run_cpu(Backend& cpu, const Model& m, std::vector<float>& x, int T) {
  const int64_t H = m.cfg.hidden_size;
  std::vector<float> ref(size_t(T * H));
  cpu.begin_forward();
  cpu.moe(test::host_f32(ref, {T, H}), test::host_f32(x, {T, H}), m.host, m.cfg);
  return ref;
}

std::vector<float> run_gpu(CudaBackend& gpu, const Model& m, const std::vector<float>& x, int T) {
  const int64_t H = m.cfg.hidden_size;
  gpu.begin_forward();
  Tensor dx = test::upload_f32(gpu, x, {T, H});
  Tensor dy = gpu.alloc(DType::F32, {T, H});
  gpu.moe(dy, dx, m.dev, m.cfg);
  return test::download(gpu, dy);
}

// run_gpu with the environment switch `name` set to `value` for the run.
std::vector<float> run_gpu_under(CudaBackend& gpu, const Model& m, const std::vector<float>& x, int T, const char* name,
                                 const char* value) {
  test::EnvGuard g(name, value);
  return run_gpu(gpu, m, x, T);
}

// Same experts chosen on both sides (fp32 router logits agree to ~1e-6, far below the gaps between the top-k and
// the rest on random inputs), then near-fp32 products (bf16 hi/lo split of the activations, exact codes, fp32
// accumulation) in another order than the CPU's. Measured on the H200 (docs/notes/cuda-prefill-v2-moe.md): 6.3e-12
// .. 5.2e-11 over every shape, format, tile height and router here. A wrong expert, routing weight or row gives
// NMSE > 1e-2; 1e-9 is 19x over the largest value measured (the kernels have no float atomics: same seeds, same
// bits). The wgmma loop (FERN_GEMM=wg, the default on sm_90a) splits the dequantized weights into bf16 hi + lo as
// well and drops x_lo w_lo, twice (gate/up, then down on the split h): measured 7.8e-12 .. 3.0e-10 over the same
// cases (docs/notes/cuda-prefill-v4-wg.md), 3.3x under the limit and still 3 orders below a bf16 rounding (~1e-6).
constexpr double kNmse = 1e-9;
// FERN_MOE_DEQUANT=separate rounds every dequantized weight s q + b to bf16 (relative error up to 2^-9): measured
// 8.1e-6 at the real shape; 1e-4 (12x over it) still separates it from a wrong expert (> 1e-2).
constexpr double kNmseBf16Weights = 1e-4;
// FERN_GEMM=fp16x2 (the pipelined loop on fp16 hi + lo rows and exact codes) keeps kNmse.
// The fp16 tile loop for 4/8-bit experts (FERN_GEMM=fp16, gemm_tile_f16.cuh): x, the dequantized weights and h are
// each rounded once to fp16 (relative 2^-11). Measured on the H200 (docs/notes/cuda-prefill-v3-gemm.md): 2.2e-7 ..
// 2.7e-7 at the real shape, up to 4.4e-7 (8-bit experts, T = 2). 2e-6 is 4.5x over the largest and still separates
// a wrong expert, weight or row (> 1e-2).
constexpr double kNmseF16 = 2e-6;
// FERN_GEMM_WG_PIPE=q4h (the exact-code loop on one fp16 row of x and of h, docs/notes/cuda-prefill-v13-q4h.md): x
// and h each rounded once to fp16, the codes and their scales exact, so at most the fp16 loop's error (which also
// rounds every weight): kNmseF16. Not yet measured on a GPU.
constexpr double kNmseQ4h = kNmseF16;

// One GPU run under some switches, compared with the CPU output of the same input.
struct Variant {
  std::string what;
  const char* env = nullptr;  // switch name (nullptr: defaults)
  const char* value = nullptr;
  double limit = kNmse;
  bool prefetch = false;         // FERN_MOE_PREFETCH=1 as well
  const char* gemm = nullptr;    // FERN_GEMM as well (fp16: for affine experts the limit is at least kNmseF16)
  const char* pipe = nullptr;    // FERN_GEMM_WG_PIPE as well
};

// Runs every variant on one input against one CPU reference (the CPU side is the slow one at real shapes).
void check(CudaBackend& gpu, Backend& cpu, const Model& m, int T, uint64_t seed, const std::vector<Variant>& vs,
           float mean = 0.0f) {
  auto x = inputs(m, T, seed, mean);
  const auto ref = run_cpu(cpu, m, x, T);
  for (const Variant& v : vs) {
    test::EnvGuard g(v.env != nullptr ? v.env : "FERN_MOE_UNUSED", v.value);
    test::EnvGuard pf("FERN_MOE_PREFETCH", v.prefetch ? "1" : nullptr);
    test::EnvGuard gm("FERN_GEMM", v.gemm);
    test::EnvGuard wp("FERN_GEMM_WG_PIPE", v.pipe);
    const auto got = run_gpu(gpu, m, x, T);
    const double e = test::nmse(got.data(), ref.data(), got.size());
    const bool f16 = v.gemm != nullptr && std::string(v.gemm) == "fp16";
    const double limit = f16 && !v.prefetch && m.host.gate.bits != 16 ? std::max(v.limit, kNmseF16) : v.limit;
    std::printf("moe prefill %-30s E=%ld H=%ld I=%ld Is=%ld k=%d bits=%d T=%-5d NMSE %.3e\n", v.what.c_str(),
                long(m.cfg.num_experts), long(m.cfg.hidden_size), long(m.cfg.moe_intermediate_size),
                long(m.cfg.shared_expert_intermediate_size), m.cfg.num_experts_per_tok, m.host.gate.bits, T, e);
    EXPECT_LT(e, limit) << v.what << " T=" << T;
  }
}

// Every tile height, with and without the register prefetch of the precise tile loop, on the fp16 loops and on both
// forms of the wgmma loop (all with the default router: the 16-row tensor-core kernel below 2,048 rows, the dense GEMM
// path from there); each router form at every T (tiles, gemm; the fused router GEMV).
// tall: the experts are 4-bit with groups of 64, so the exact-code loop also runs 96- and 128-row tiles.
std::vector<Variant> tile_variants(const char* what, bool tall) {
  std::vector<Variant> vs;
  for (bool pf : {false, true})
    for (const char* bm : {"16", "32", "64"})
      vs.push_back({std::string(what) + ", tile " + bm + (pf ? " pf" : ""), "FERN_MOE_TILE", bm, kNmse, pf});
  std::vector<const char*> gemms = {"fp16", "fp16x2"};
  if (cuda::gemm_wg_supported()) gemms.push_back("wg");
  for (const char* gemm : gemms)
    for (const char* bm : {"16", "32", "64"})
      vs.push_back({std::string(what) + ", tile " + bm + " " + gemm, "FERN_MOE_TILE", bm, kNmse, false, gemm});
  if (cuda::gemm_wg_supported()) {
    for (const char* bm : {"16", "32", "64"})
      vs.push_back({std::string(what) + ", tile " + bm + " wg sync", "FERN_MOE_TILE", bm, kNmse, false, "wg", "sync"});
    // 96- and 128-row tiles: the exact-code loop only (the default wg form for 4-bit experts with groups of 64)
    if (tall)
      for (const char* bm : {"96", "128"})
        vs.push_back({std::string(what) + ", tile " + bm + " wg", "FERN_MOE_TILE", bm, kNmse, false, "wg"});
  }
  vs.push_back({std::string(what) + ", router fused", "FERN_MOE_ROUTER", "fused"});
  vs.push_back({std::string(what) + ", router tiles", "FERN_MOE_ROUTER", "tiles"});
  vs.push_back({std::string(what) + ", router gemm", "FERN_MOE_ROUTER", "gemm"});
  return vs;
}

const Shape kReal{"real", 256, 2048, 512, 512, 8, 4, 64};

bool q4_shape(const Shape& s) { return s.bits == 4 && s.gs % 64 == 0; }

TEST(CudaMoePrefill, RealShapeAgainstCpu) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  auto m = make_model(*gpu, kReal, 11, false);
  ASSERT_TRUE(grouped_ok(*m));
  std::vector<Variant> vs = {{"real, default"},
                             {"real, split", nullptr, nullptr, kNmse, false, "split"},
                             {"real, fp16", nullptr, nullptr, kNmse, false, "fp16"},
                             {"real, fp16x2", nullptr, nullptr, kNmse, false, "fp16x2"}};
  if (cuda::gemm_wg_supported()) {
    vs.push_back({"real, q4h", nullptr, nullptr, kNmseQ4h, false, nullptr, "q4h"});
    // The bias term promoted per tile by FMAs (q4, opt-in; the default q4b puts it on the tensor cores): as precise.
    vs.push_back({"real, q4", nullptr, nullptr, kNmse, false, nullptr, "q4"});
    vs.push_back({"real, wg", nullptr, nullptr, kNmse, false, "wg"});
    vs.push_back({"real, wg ws", nullptr, nullptr, kNmse, false, "wg", "ws"});
    vs.push_back({"real, wg sync", nullptr, nullptr, kNmse, false, "wg", "sync"});
    vs.push_back({"real, wg sync 2 stages", "FERN_GEMM_WG_STAGES", "2", kNmse, false, "wg", "sync"});
    vs.push_back({"real, wg sync 4 stages", "FERN_GEMM_WG_STAGES", "4", kNmse, false, "wg", "sync"});
  }
  for (int T : {2, 17, 64, 300, 2048}) check(*gpu, *cpu, *m, T, 100 + T, vs);
}

// Every tile height, the old row-by-row path and the separate dequantisation at one real-shape chunk. The grouped
// results must not depend on the order of the pairs inside a group nor on who built the grouping: host and GPU
// routing give bit-identical outputs, and so do two runs and the loop with and without the register prefetch.
TEST(CudaMoePrefill, AblationSwitches) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  auto m = make_model(*gpu, kReal, 12, false);
  const int T = 300;
  auto vs = tile_variants("real", true);
  vs.push_back({"real, tile fixed", "FERN_MOE_TILE", "fixed"});
  vs.push_back({"real, tile adaptive", "FERN_MOE_TILE", "adaptive"});
  vs.push_back({"real, routing host", "FERN_MOE_ROUTING", "host"});
  vs.push_back({"real, rows (decode kernels)", "FERN_MOE_PATH", "rows"});
  vs.push_back({"real, routing host fp16", "FERN_MOE_ROUTING", "host", kNmse, false, "fp16"});
  vs.push_back({"real, routing host fp16x2", "FERN_MOE_ROUTING", "host", kNmse, false, "fp16x2"});
  if (cuda::gemm_wg_supported()) vs.push_back({"real, routing host wg", "FERN_MOE_ROUTING", "host", kNmse, false, "wg"});
  vs.push_back({"real, dequant separate", "FERN_MOE_DEQUANT", "separate", kNmseBf16Weights});
  check(*gpu, *cpu, *m, T, 7, vs);

  auto x = inputs(*m, T, 8, 0.0f);
  const auto dev_routed = run_gpu(*gpu, *m, x, T);
  const auto again = run_gpu(*gpu, *m, x, T);
  EXPECT_EQ(dev_routed, again) << "two runs of the same chunk differ";
  {
    // The prefetch only moves loads earlier in the split loop: same products in the same order.
    test::EnvGuard split("FERN_GEMM", "split");
    const auto split_out = run_gpu(*gpu, *m, x, T);
    test::EnvGuard pf("FERN_MOE_PREFETCH", "1");
    EXPECT_EQ(split_out, run_gpu(*gpu, *m, x, T)) << "the register prefetch changes the result";
  }
  // The pipelined loops are other computations (another summation order: the bits differ from split's),
  // deterministic, and independent of who built the grouping too.
  std::vector<float> by_mode[4];
  std::vector<const char*> gemms = {"split", "fp16", "fp16x2"};
  if (cuda::gemm_wg_supported()) gemms.push_back("wg");
  int i = 0;
  for (const char* gemm : gemms) {
    test::EnvGuard gm("FERN_GEMM", gemm);
    by_mode[i] = run_gpu(*gpu, *m, x, T);
    EXPECT_EQ(by_mode[i], run_gpu(*gpu, *m, x, T)) << "two runs differ, FERN_GEMM=" << gemm;
    test::EnvGuard e("FERN_MOE_ROUTING", "host");
    EXPECT_EQ(by_mode[i], run_gpu(*gpu, *m, x, T)) << "host and GPU grouping differ, FERN_GEMM=" << gemm;
    ++i;
  }
  EXPECT_NE(by_mode[0], by_mode[1]) << "FERN_GEMM=fp16 did not take the fp16 loop";
  EXPECT_NE(by_mode[0], by_mode[2]) << "FERN_GEMM=fp16x2 did not take the pipelined loop";
  EXPECT_NE(by_mode[1], by_mode[2]) << "fp16 and fp16x2 gave the same bits";
  if (gemms.size() > 3) {
    EXPECT_NE(by_mode[0], by_mode[3]) << "FERN_GEMM=wg did not take the wgmma loop";
    // The warp-specialized form (the default) and the synchronous one: the same MMAs in the same order, same bits.
    test::EnvGuard gm("FERN_GEMM", "wg");
    test::EnvGuard ws("FERN_GEMM_WG_PIPE", "ws");
    const auto ws_out = run_gpu(*gpu, *m, x, T);
    test::EnvGuard sync("FERN_GEMM_WG_PIPE", "sync");
    EXPECT_EQ(ws_out, run_gpu(*gpu, *m, x, T)) << "the warp-specialized and synchronous wgmma loops differ";
  }
  test::EnvGuard e("FERN_MOE_ROUTING", "host");
  const auto host_routed = run_gpu(*gpu, *m, x, T);
  EXPECT_EQ(dev_routed, host_routed) << "host and GPU grouping differ";
  {
    test::EnvGuard bad_gemm("FERN_GEMM", "fast");
    EXPECT_THROW(run_gpu(*gpu, *m, x, T), Error);
  }
  {
    test::EnvGuard bad_router("FERN_MOE_ROUTER", "wide");
    EXPECT_THROW(run_gpu(*gpu, *m, x, T), Error);
  }
  {
    // 96- and 128-row tiles where the exact-code loop does not run: a named user error, not a wrong result.
    test::EnvGuard split("FERN_GEMM", "split");
    for (const char* bm : {"96", "128"}) {
      test::EnvGuard tall("FERN_MOE_TILE", bm);
      EXPECT_THROW(run_gpu(*gpu, *m, x, T), Error) << bm;
    }
  }
  test::EnvGuard bad("FERN_MOE_TILE", "48");
  EXPECT_THROW(run_gpu(*gpu, *m, x, T), Error);
}

// Several column blocks per block on the exact-code loop (FERN_MOE_DOWN_SEQ, FERN_MOE_GATE_UP_SEQ; docs/notes/
// cuda-prefill-v8-items.md). Each item runs the MMAs of a block of its own in the same order: every count gives the
// same bits, also where a block's last items fall past the columns (down: 16 column blocks, gate/up: 8; 3 and 5
// leave partial blocks, 64 exceeds both), at 64-, 96- and 128-row tiles; and the CPU agrees.
TEST(CudaMoePrefill, ColumnBlocksPerBlock) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no wgmma on this GPU/build";
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  auto m = make_model(*gpu, kReal, 13, false);
  for (int T : {300, 2048}) {
    auto x = inputs(*m, T, 30 + T, 0.0f);
    const auto ref = run_cpu(*cpu, *m, x, T);
    const auto by_default = run_gpu(*gpu, *m, x, T);
    const double e = test::nmse(by_default.data(), ref.data(), by_default.size());
    std::printf("moe prefill, default column blocks per block, T=%d: NMSE %.3e\n", T, e);
    EXPECT_LT(e, kNmse);
    for (const char* tile : {"64", "96", "128"}) {
      test::EnvGuard t("FERN_MOE_TILE", tile);
      std::vector<float> base;
      {
        test::EnvGuard d("FERN_MOE_DOWN_SEQ", "1");
        test::EnvGuard g("FERN_MOE_GATE_UP_SEQ", "1");
        base = run_gpu(*gpu, *m, x, T);
      }
      EXPECT_LT(test::nmse(base.data(), ref.data(), base.size()), kNmse) << "tile " << tile << " T=" << T;
      for (auto [down, gate_up] : {std::pair{"8", "2"}, {"3", "5"}, {"2", "8"}, {"64", "64"}}) {
        test::EnvGuard d("FERN_MOE_DOWN_SEQ", down);
        test::EnvGuard g("FERN_MOE_GATE_UP_SEQ", gate_up);
        EXPECT_EQ(run_gpu(*gpu, *m, x, T), base)
            << "down " << down << " gate/up " << gate_up << " per block, tile " << tile << " T=" << T;
      }
    }
  }
  auto x = inputs(*m, 64, 5, 0.0f);
  for (const char* bad : {"0", "65", "4,2"}) {
    test::EnvGuard d("FERN_MOE_DOWN_SEQ", bad);
    EXPECT_THROW(run_gpu(*gpu, *m, x, 64), Error) << bad;
  }
}

// FERN_MOE_NARROW=1 (docs/notes/cuda-prefill-v18-narrow.md): the 96/128-row tiles of the exact-code loop in up to
// three launches by their fill (more than 64 rows at the full width, 33-64 on the 64-token loop, 1-32 on the 32-token
// loop). A row's products and promotions are those of the one-launch form in the same order, so the same bits are
// expected; the bound 1e-12 (against the one-launch result) still catches a skipped, doubled or misplaced tile
// (NMSE ~1). T = 300 puts every routed tile and the shared expert's last tile (44 rows) in the narrow classes;
// T = 2,048 and 4,096 (about 64 and 128 rows per expert) spread the routed tiles over all three.
TEST(CudaMoePrefill, NarrowTilesByFill) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no wgmma on this GPU/build";
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  auto m = make_model(*gpu, kReal, 17, false);
  for (int T : {300, 2048, 4096}) {
    auto x = inputs(*m, T, 50 + T, 0.0f);
    std::vector<float> ref;
    if (T <= 2048) ref = run_cpu(*cpu, *m, x, T);
    for (const char* tile : {"96", "128"}) {
      test::EnvGuard t("FERN_MOE_TILE", tile);
      const auto one = run_gpu_under(*gpu, *m, x, T, "FERN_MOE_NARROW", "0");
      const auto split = run_gpu_under(*gpu, *m, x, T, "FERN_MOE_NARROW", "1");
      const double d = test::nmse(split.data(), one.data(), one.size());
      std::printf("moe prefill, tile %s, T=%d: launches by fill vs one launch NMSE %.3e (%s)\n", tile, T, d,
                  split == one ? "same bits" : "bits differ");
      EXPECT_LT(d, 1e-12) << "tile " << tile << " T=" << T;
      if (!ref.empty()) {
        EXPECT_LT(test::nmse(split.data(), ref.data(), ref.size()), kNmse) << "tile " << tile;
      }
    }
  }
  test::EnvGuard bad("FERN_MOE_NARROW", "2");
  auto x = inputs(*m, 64, 5, 0.0f);
  EXPECT_THROW(run_gpu(*gpu, *m, x, 64), Error);
}

// The tile map with MoeGroups::extra (docs/notes/cuda-prefill-v26-tail.md): a group's last 128-row tile takes up to
// kMoeTailRows rows more. Host arithmetic and the switch: runs without a GPU.
TEST(CudaMoeTileMap, LastTileTakesTheTail) {
  for (int c : {0, 1, 127, 128, 129, 256, 300})
    EXPECT_EQ(cuda::moe_group_tiles(c, 128, 0), (c + 127) / 128) << c;  // extra 0: the plain map
  struct Case {
    int rows, tiles, last;
  };
  for (const Case k : {Case{0, 0, 0}, Case{1, 1, 1}, Case{128, 1, 128}, Case{129, 1, 129}, Case{144, 1, 144},
                       Case{145, 2, 17}, Case{256, 2, 128}, Case{272, 2, 144}, Case{273, 3, 17}}) {
    const int n = cuda::moe_group_tiles(k.rows, 128, 16);
    EXPECT_EQ(n, k.tiles) << k.rows << " rows";
    for (int j = 0; j + 1 < n; ++j) EXPECT_EQ(cuda::moe_tile_rows_at(k.rows, 128 * j, 128, 16), 128) << k.rows;
    if (n > 0) {
      EXPECT_EQ(cuda::moe_tile_rows_at(k.rows, 128 * (n - 1), 128, 16), k.last) << k.rows << " rows";
    }
  }
  {
    test::EnvGuard unset("FERN_MOE_TAIL", nullptr);
    EXPECT_EQ(cuda::moe_tail_rows(128, true), cuda::kMoeTailRows);
    EXPECT_EQ(cuda::moe_tail_rows(96, true), 0);
    EXPECT_EQ(cuda::moe_tail_rows(128, false), 0);
  }
  {
    test::EnvGuard off("FERN_MOE_TAIL", "0");
    EXPECT_EQ(cuda::moe_tail_rows(128, true), 0);
  }
  test::EnvGuard bad("FERN_MOE_TAIL", "16");
  EXPECT_THROW(cuda::moe_tail_rows(128, true), Error);
}

// The GPU's map (group_kernel) with extra = kMoeTailRows on ids of known counts: every group's tiles and their rows
// as moe_group_tiles / moe_tile_rows_at say, the shared expert's (T = 1,105: 8 full tiles and 81 rows) last.
TEST(CudaMoeTileMap, GpuMapTakesTheTail) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  const std::vector<int> counts = {142, 129, 145, 0, 16, 128, 272, 273};
  const int E = int(counts.size()), k = 1, bm = 128, extra = cuda::kMoeTailRows;
  std::vector<int32_t> ids;
  for (int e = E - 1; e >= 0; --e)  // expert order reversed, so that the grouping has to sort
    ids.insert(ids.end(), size_t(counts[size_t(e)]), e);
  const int T = int(ids.size());
  const int64_t max_tiles = cuda::moe_max_tiles(T, k, E, bm);
  auto i32 = [&](int64_t n) { return gpu->alloc(DType::I32, {n}); };
  Tensor d_ids = i32(T), d_counts = i32(E + 1), d_offsets = i32(E + 1), d_order = i32(T), d_tiles = i32(2 * max_tiles),
         d_n = i32(1);
  gpu->copy(d_ids, Tensor(ids.data(), DType::I32, {T}));
  cuda::MoeGroups g;
  g.counts = d_counts.ptr<int32_t>();
  g.offsets = d_offsets.ptr<int32_t>();
  g.order = d_order.ptr<int32_t>();
  g.tiles = d_tiles.ptr<int32_t>();
  g.n_tiles = d_n.ptr<int32_t>();
  g.extra = extra;
  cuda::Ctx ctx;
  ctx.stream = gpu->stream();
  ctx.sms = gpu->sm_count();
  cuda::moe_group(ctx, d_ids.ptr<int32_t>(), T, k, E, bm, g);
  std::vector<int32_t> tiles(size_t(2 * max_tiles)), n(1);
  gpu->copy(Tensor(tiles.data(), DType::I32, {2 * max_tiles}), d_tiles);
  gpu->copy(Tensor(n.data(), DType::I32, {1}), d_n);
  std::vector<std::pair<int, int>> want;  // (group, first row)
  for (int e = 0; e <= E; ++e) {
    const int c = e < E ? counts[size_t(e)] : T;
    for (int j = 0; j < cuda::moe_group_tiles(c, bm, extra); ++j) want.emplace_back(e, j * bm);
  }
  ASSERT_EQ(n[0], int(want.size()));
  int wide = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tiles[2 * i], want[i].first) << "tile " << i;
    EXPECT_EQ(tiles[2 * i + 1], want[i].second) << "tile " << i;
    const int c = want[i].first < E ? counts[size_t(want[i].first)] : T;
    wide += cuda::moe_tile_rows_at(c, want[i].second, bm, extra) > bm ? 1 : 0;
  }
  EXPECT_EQ(wide, 3);  // 142, 129 and 272's last 144: the cases the 144-token pass exists for
}

// The 144-token pass against the CPU and against the map without it (FERN_MOE_TAIL=0), at 128-row tiles. The hot
// expert (every token) at T = 270 holds 2 x 128 + 14 rows, so its last tile and the shared expert's hold 142 rows;
// at T = 4,100 (about 128 +- 11 rows per expert) about two in five experts' rows fit one 144-token tile, and the
// shared expert's last holds 132. A row's products, partial sums and promotions are the same in either pass, so the
// same bits are expected; 1e-12 still catches a skipped, doubled or misplaced row (NMSE ~1).
TEST(CudaMoePrefill, TailRowsInTheLastTile) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no wgmma on this GPU/build";
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  test::EnvGuard t("FERN_MOE_TILE", "128");
  for (const bool hot : {true, false}) {
    auto m = make_model(*gpu, kReal, 19, hot);
    const int T = hot ? 270 : 4100;
    auto x = inputs(*m, T, 60 + T, hot ? 0.5f : 0.0f);
    const auto with = run_gpu_under(*gpu, *m, x, T, "FERN_MOE_TAIL", "1");
    const auto without = run_gpu_under(*gpu, *m, x, T, "FERN_MOE_TAIL", "0");
    const double d = test::nmse(with.data(), without.data(), with.size());
    std::printf("moe prefill, tile 128, T=%d: 144-token tail passes vs none NMSE %.3e (%s)\n", T, d,
                with == without ? "same bits" : "bits differ");
    EXPECT_LT(d, 1e-12) << "T=" << T;
    if (hot) {
      const auto ref = run_cpu(*cpu, *m, x, T);
      const double e = test::nmse(with.data(), ref.data(), ref.size());
      std::printf("moe prefill, tile 128, T=%d, hot expert: 144-token tail passes vs CPU NMSE %.3e\n", T, e);
      EXPECT_LT(e, kNmse);
    }
  }
}

// moe_residual over several rows (resid += delta; xn = rmsnorm(resid); out = moe(xn); resid += out) with the last add
// in the combine's pass (FERN_MOE_RESID=combine, the default) and as its own launch (=add): the same sums in the same
// order, so the same bits for resid and out; both against the CPU backend (kNmse, as the block alone). The
// row-by-row path (FERN_MOE_PATH=rows, no combine) adds by its own launch under either value. An unknown value is an
// error. (Equal bits cannot tell whether the combine form ran; the prefill timeline does: no add_kernel under
// combine, docs/notes/cuda-prefill-v29-resid-combine.md.) The input norm computed straight into gate/up's rows
// (FERN_CUDA_NORM_ROWS=fused) gives the same bits as add_rmsnorm and the separate conversion.
TEST(CudaMoePrefill, ResidualAddInTheCombine) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  auto m = make_model(*gpu, kReal, 23, false);
  const int64_t H = m->cfg.hidden_size;
  const float eps = 1e-6f;
  for (int T : {17, 300}) {
    auto resid0 = test::randn(size_t(T * H), 80 + T), delta = test::randn(size_t(T * H), 81 + T);
    auto norm_w = test::randn(size_t(H), 82 + T);
    for (float& v : norm_w) v = 1.0f + 0.1f * v;
    std::vector<float> cpu_resid = resid0, cpu_out(size_t(T * H)), cpu_xn(size_t(T * H)), cpu_delta = delta;
    cpu->begin_forward();
    cpu->moe_residual(test::host_f32(cpu_resid, {T, H}), test::host_f32(cpu_delta, {T, H}),
                      test::host_f32(cpu_xn, {T, H}), test::host_f32(norm_w, {H}), eps,
                      test::host_f32(cpu_out, {T, H}), m->host, m->cfg);
    // out_is_delta: out given as delta's tensor, as the forward pass does.
    auto run = [&](const char* where, const char* path, bool out_is_delta, const char* norm_rows = "fused",
                   const char* router = nullptr) {
      test::EnvGuard r("FERN_MOE_RESID", where);
      test::EnvGuard nr("FERN_CUDA_NORM_ROWS", norm_rows);
      test::EnvGuard rf("FERN_MOE_ROUTER", router);
      test::EnvGuard p("FERN_MOE_PATH", path);
      gpu->begin_forward();
      Tensor dr = test::upload_f32(*gpu, resid0, {T, H}), dd = test::upload_f32(*gpu, delta, {T, H});
      Tensor dn = test::upload_f32(*gpu, norm_w, {H});
      Tensor dx = gpu->alloc(DType::F32, {T, H});
      Tensor dout = out_is_delta ? dd : gpu->alloc(DType::F32, {T, H});
      gpu->moe_residual(dr, dd, dx, dn, eps, dout, m->dev, m->cfg);
      return std::pair{test::download(*gpu, dr), test::download(*gpu, dout)};
    };
    for (const auto& [path, out_is_delta] : {std::pair{"grouped", true}, {"grouped", false}, {"rows", true}}) {
      const auto [r_comb, o_comb] = run("combine", path, out_is_delta);
      const auto [r_add, o_add] = run("add", path, out_is_delta);
      EXPECT_EQ(r_comb, r_add) << "resid, T=" << T << " " << path;
      EXPECT_EQ(o_comb, o_add) << "out, T=" << T << " " << path;
      // The input norm straight into gate/up's rows (FERN_CUDA_NORM_ROWS=fused, the default above) against
      // add_rmsnorm, then the conversion (separate): the same bits.
      const auto [r_sep, o_sep] = run("combine", path, out_is_delta, "separate");
      EXPECT_EQ(r_comb, r_sep) << "resid, norm rows, T=" << T << " " << path;
      EXPECT_EQ(o_comb, o_sep) << "out, norm rows, T=" << T << " " << path;
      // The router on the wgmma loop (its form from 2,048 rows, forced here): its plain bf16 rows from the same pass.
      const auto [r_rg, o_rg] = run("combine", path, out_is_delta, "fused", "gemm");
      const auto [r_rgs, o_rgs] = run("combine", path, out_is_delta, "separate", "gemm");
      EXPECT_EQ(r_rg, r_rgs) << "resid, norm rows, router gemm, T=" << T << " " << path;
      EXPECT_EQ(o_rg, o_rgs) << "out, norm rows, router gemm, T=" << T << " " << path;
      EXPECT_LT(test::nmse(o_rg.data(), cpu_out.data(), cpu_out.size()), kNmse) << path << " router gemm T=" << T;
      const double er = test::nmse(r_comb.data(), cpu_resid.data(), cpu_resid.size());
      const double eo = test::nmse(o_comb.data(), cpu_out.data(), cpu_out.size());
      std::printf("moe_residual %s, T=%d: resid NMSE %.3e, out NMSE %.3e against the CPU\n", path, T, er, eo);
      EXPECT_LT(er, kNmse) << path << " T=" << T;
      EXPECT_LT(eo, kNmse) << path << " T=" << T;
    }
  }
  test::EnvGuard bad("FERN_MOE_RESID", "fused");
  auto x = test::randn(size_t(64 * H), 5);
  gpu->begin_forward();
  Tensor dr = test::upload_f32(*gpu, x, {64, H}), dd = test::upload_f32(*gpu, x, {64, H});
  Tensor dn = test::upload_f32(*gpu, std::vector<float>(size_t(H), 1.0f), {H});
  Tensor dx = gpu->alloc(DType::F32, {64, H}), dout = gpu->alloc(DType::F32, {64, H});
  EXPECT_THROW(gpu->moe_residual(dr, dd, dx, dn, eps, dout, m->dev, m->cfg), Error);
}

// The shared-expert gate's logit in the top-k kernel (FERN_MOE_SGATE=topk, the default for 4/8-bit gates) against
// the GEMV launch (=gemv): both against the CPU (kNmse), at the real shape (8-bit gate; T = 17 on the 16-row router
// tiles, 2,048 on the dense GEMM router) and the awkward ones (8-bit groups of 32, I 96 with groups of 32; bf16
// experts have a bf16 gate, which keeps the GEMV under either value: same bits). The two forms add the gate's
// products in another order (~1 ulp in the logit, ~1e-7 relative in the shared expert's factor): 1e-12 against each
// other still catches a wrong row, group or scale (NMSE ~1e-3 or more). An unknown value is an error.
TEST(CudaMoePrefill, SharedGateInTheTopkKernel) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  const Shape shapes[] = {kReal, {"8-bit group 32", 12, 256, 64, 96, 3, 8, 32},
                          {"top-2 of 6, I 96, group 32", 6, 192, 96, 64, 2, 4, 32},
                          {"bf16 experts", 32, 512, 128, 128, 8, 16, 0}};
  for (const Shape& sh : shapes) {
    auto m = make_model(*gpu, sh, 24, false);
    for (int T : {17, 2048}) {
      auto x = inputs(*m, T, 90 + T, 0.0f);
      const auto ref = run_cpu(*cpu, *m, x, T);
      const auto in_topk = run_gpu_under(*gpu, *m, x, T, "FERN_MOE_SGATE", "topk");
      const auto by_gemv = run_gpu_under(*gpu, *m, x, T, "FERN_MOE_SGATE", "gemv");
      const double d = test::nmse(in_topk.data(), by_gemv.data(), by_gemv.size());
      const double e = test::nmse(in_topk.data(), ref.data(), ref.size());
      std::printf("moe prefill %s, T=%d: shared gate in the top-k kernel vs GEMV NMSE %.3e (%s), vs CPU %.3e\n",
                  sh.name, T, d, in_topk == by_gemv ? "same bits" : "bits differ", e);
      EXPECT_LT(d, 1e-12) << sh.name << " T=" << T;
      EXPECT_LT(e, kNmse) << sh.name << " T=" << T;
      EXPECT_LT(test::nmse(by_gemv.data(), ref.data(), ref.size()), kNmse) << sh.name << " gemv T=" << T;
      if (sh.bits == 16) {
        EXPECT_EQ(in_topk, by_gemv) << "a bf16 gate took the top-k kernel's form";
      }
    }
  }
  auto m = make_model(*gpu, kReal, 25, false);
  auto x = inputs(*m, 64, 5, 0.0f);
  test::EnvGuard bad("FERN_MOE_SGATE", "fused");
  EXPECT_THROW(run_gpu(*gpu, *m, x, 64), Error);
}

// Expert 0 gets every row (a hot expert spanning many tiles), expert E-1 none. The CPU routing confirms the bias
// did what it should, so the test cannot pass without exercising both.
TEST(CudaMoePrefill, HotAndEmptyExperts) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  for (const Shape& s : {kReal, Shape{"top-2 of 6", 6, 192, 96, 64, 2, 4, 32}}) {
    auto m = make_model(*gpu, s, 13, true);
    for (int T : {17, 2048}) {
      auto x = inputs(*m, T, 200 + T, 0.5f);
      std::vector<float> logits(size_t(T * s.E));
      std::vector<int32_t> ids(size_t(T * s.k));
      std::vector<float> wts(size_t(T * s.k));
      cpu::linear(logits.data(), x.data(), T, m->host.router, 4);
      cpu::moe_route(logits.data(), T, s.E, s.k, true, ids.data(), wts.data());
      for (int t = 0; t < T; ++t) {
        const auto b = ids.begin() + t * s.k, e = b + s.k;
        ASSERT_NE(std::find(b, e, 0), e) << "token " << t << " does not pick expert 0";
        ASSERT_EQ(std::find(b, e, int32_t(s.E - 1)), e) << "token " << t << " picks expert E-1";
      }
      check(*gpu, *cpu, *m, T, 200 + T, tile_variants((std::string("hot/empty ") + s.name).c_str(), q4_shape(s)), 0.5f);
    }
  }
}

TEST(CudaMoePrefill, AwkwardShapesAndFormats) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  const Shape shapes[] = {
      {"top-2 of 6, I 96, group 32", 6, 192, 96, 64, 2, 4, 32},
      {"I 160, Is 96, group 32", 16, 320, 160, 96, 4, 4, 32},
      {"8-bit experts", 32, 512, 256, 128, 8, 8, 64},
      {"8-bit group 32", 12, 256, 64, 96, 3, 8, 32},
      {"bf16 experts", 32, 512, 128, 128, 8, 16, 0},
  };
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.name);
    auto m = make_model(*gpu, s, 14, false);
    ASSERT_TRUE(grouped_ok(*m));
    for (int T : {2, 17, 300}) check(*gpu, *cpu, *m, T, 300 + T, tile_variants(s.name, q4_shape(s)));
  }
}

// Widths that are not multiples of 16 (possible with bf16 experts only: affine widths are multiples of the group)
// are refused by the grouped path; moe() must then take the row-by-row kernels and still be right.
TEST(CudaMoePrefill, FallbackForUnsupportedWidth) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  auto m = make_model(*gpu, {"bf16 I 40", 8, 256, 40, 64, 2, 16, 0}, 15, false);
  ASSERT_FALSE(grouped_ok(*m));
  check(*gpu, *cpu, *m, 33, 400, {{"fallback bf16 I 40"}});
}

}  // namespace
}  // namespace fern
