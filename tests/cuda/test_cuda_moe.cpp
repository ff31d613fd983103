// CUDA MoE (router + softmax + top-k + renorm, fused gate/up + SiLU, fused down + routing weights + gated shared
// expert) against the CPU backend: real shapes (256 experts top-8, H 2048, I 512, 4-bit experts, 8-bit router and
// shared gate), several token rows, bf16 experts, and an awkward small configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "core/bf16.h"
#include "cuda/kernels.h"
#include "cuda/qweight.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

struct MoeCase {
  const char* name;
  int64_t E, H, I, Is;
  int k, bits, T;
  int rbits = 0;  // router and shared-expert gate: 0 = 8-bit (16 with bf16 experts)
};

MoeWeights make_moe(test::OwnedStorage& st, const MoeCase& c, uint64_t seed) {
  const int rbits = c.rbits != 0 ? c.rbits : c.bits == 16 ? 16 : 8;
  return test::random_moe(st, c.E, c.H, c.I, c.Is, c.bits, 64, rbits, seed);
}

// Same selected experts on both sides (fp32 logits agree to ~1e-6, far below the gaps between the top-8 and the
// rest on random inputs), then fp32 GEMVs in different orders: measured NMSE 8e-12..1.5e-11 (4-bit), 1e-13
// (bf16) on the H200. A wrong expert or weight gives NMSE > 1e-2; 1e-8 separates the two.
constexpr double kNmse = 1e-8;

ModelConfig moe_config(const MoeCase& c) {
  ModelConfig cfg;
  cfg.num_experts = static_cast<int>(c.E);
  cfg.num_experts_per_tok = c.k;
  cfg.hidden_size = c.H;
  cfg.moe_intermediate_size = static_cast<int>(c.I);
  cfg.shared_expert_intermediate_size = static_cast<int>(c.Is);
  return cfg;
}

void run_case(const MoeCase& c) {
  SCOPED_TRACE(c.name);
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  test::OwnedStorage st;
  const uint64_t seed = uint64_t(c.E * 13 + c.H + c.I * 3 + c.bits + c.T);
  MoeWeights hw = make_moe(st, c, seed);
  MoeWeights dw = test::to_device(*gpu, hw);
  ModelConfig cfg;
  cfg.num_experts = static_cast<int>(c.E);
  cfg.num_experts_per_tok = c.k;
  cfg.hidden_size = c.H;
  cfg.moe_intermediate_size = static_cast<int>(c.I);
  cfg.shared_expert_intermediate_size = static_cast<int>(c.Is);
  auto x = test::randn(size_t(c.T * c.H), seed + 100);
  std::vector<float> ref(size_t(c.T * c.H));
  cpu->begin_forward();
  cpu->moe(test::host_f32(ref, {c.T, c.H}), test::host_f32(x, {c.T, c.H}), hw, cfg);
  gpu->begin_forward();
  Tensor dx = test::upload_f32(*gpu, x, {c.T, c.H});
  Tensor dy = gpu->alloc(DType::F32, {c.T, c.H});
  gpu->moe(dy, dx, dw, cfg);
  auto got = test::download(*gpu, dy);
  const double e = test::nmse(got.data(), ref.data(), got.size());
  std::printf("moe %-18s E=%ld H=%ld I=%ld Is=%ld k=%d bits=%d T=%d  NMSE %.3e\n", c.name, long(c.E), long(c.H),
              long(c.I), long(c.Is), c.k, c.bits, c.T, e);
  EXPECT_LT(e, kNmse);
}

TEST(CudaMoe, RealShape) {
  FERN_REQUIRE_GPU();
  run_case({"real", 256, 2048, 512, 512, 8, 4, 1});
}

TEST(CudaMoe, SeveralRowsAndAwkward) {
  FERN_REQUIRE_GPU();
  run_case({"real T=3", 256, 2048, 512, 512, 8, 4, 3});
  run_case({"small odd", 16, 256, 64, 128, 8, 4, 2});
  run_case({"top-2 of 6", 6, 192, 128, 64, 2, 4, 1});
  run_case({"bf16", 32, 512, 128, 128, 8, 16, 2});
}

// The fused router (one GEMV over the router and shared-gate rows, top-k in the last block's tail) against the
// three-launch path it replaces (router GEMV, shared-gate GEMV, top-k kernel): same experts, same weights up to
// the summation order of the logits. Run twice in a row to check that the per-token counters reset themselves.
TEST(CudaMoe, FusedRouterMatchesThreeLaunches) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  test::OwnedStorage st;
  const MoeCase c{"route", 256, 2048, 512, 512, 8, 4, 5};
  MoeWeights hw = make_moe(st, c, 77);
  MoeWeights dw = test::to_device(*gpu, hw);
  auto x = test::randn(size_t(c.T * c.H), 78);
  Tensor dx = test::upload_f32(*gpu, x, {c.T, c.H});
  Tensor counters = gpu->alloc(DType::I32, {c.T});
  std::vector<float> zero(size_t(c.T), 0.0f);  // 0.0f has the bit pattern of int 0
  gpu->copy(counters, test::host_f32(zero, {c.T}));
  auto run = [&](bool fused) {
    cuda::Ctx ctx;
    ctx.stream = gpu->stream();
    ctx.sms = gpu->sm_count();
    ctx.pdl = gpu->pdl();
    ctx.counters = counters.ptr<int>();
    ctx.n_counters = fused ? c.T : 0;
    Tensor logits = gpu->alloc(DType::F32, {c.T, c.E}), sgl = gpu->alloc(DType::F32, {c.T});
    Tensor ids = gpu->alloc(DType::I32, {c.T, c.k}), w = gpu->alloc(DType::F32, {c.T, c.k});
    Tensor sg = gpu->alloc(DType::F32, {c.T}), h = gpu->alloc(DType::F32, {c.T, 1});
    cuda::MoeScratch s{logits.ptr<float>(), sgl.ptr<float>(), ids.ptr<int32_t>(), w.ptr<float>(), sg.ptr<float>(),
                       h.ptr<float>()};
    cuda::moe_route(ctx, cuda::make_qw(dw.router), cuda::make_qw(dw.shared_expert_gate), dx.ptr<float>(), s, c.T, c.k);
    std::vector<int32_t> hid(size_t(c.T * c.k));
    gpu->copy(Tensor(hid.data(), DType::I32, {c.T, c.k}, Device::Host), ids);
    return std::make_tuple(hid, test::download(*gpu, w), test::download(*gpu, sg));
  };
  const auto [ids3, w3, sg3] = run(false);
  for (int rep = 0; rep < 2; ++rep) {
    const auto [ids1, w1, sg1] = run(true);
    EXPECT_EQ(ids1, ids3);
    // fp32 logits of 2048 terms in two summation orders: measured differences are rounding-sized; 1e-5 relative
    // leaves room and still catches a wrong expert weight or a missing renormalisation (errors of 1e-2 and more).
    for (size_t i = 0; i < w3.size(); ++i) EXPECT_NEAR(w1[i], w3[i], 1e-5 * std::fabs(w3[i]) + 1e-7) << i;
    for (size_t i = 0; i < sg3.size(); ++i) EXPECT_NEAR(sg1[i], sg3[i], 1e-5) << i;
  }
}

// A launch context for calling the fused decode MoE directly: the backend's stream and settings, and its own
// zeroed handoff counters (persistent device memory of the backend).
cuda::Ctx fused_ctx(CudaBackend& gpu) {
  Tensor counters = gpu.alloc(DType::I32, {8});
  std::vector<float> zero(8, 0.0f);  // 0.0f has the bit pattern of int 0
  gpu.copy(counters, test::host_f32(zero, {8}));
  cuda::Ctx ctx;
  ctx.stream = gpu.stream();
  ctx.sms = gpu.sm_count();
  ctx.pdl = gpu.pdl();
  ctx.counters = counters.ptr<int>();
  ctx.n_counters = cuda::kMoeFusedCounters;
  return ctx;
}

// The scratch of one token's MoE call (router logits, shared-gate logit, top-k ids and weights, shared gate,
// SiLU(gate)*up of every slot) for a direct call of the fused decode kernel, in persistent backend memory.
cuda::MoeScratch fused_scratch(CudaBackend& gpu, const MoeCase& c) {
  auto f32 = [&](int64_t n) { return gpu.alloc(DType::F32, {n}).ptr<float>(); };
  return cuda::MoeScratch{f32(c.E), f32(1), gpu.alloc(DType::I32, {c.k}).ptr<int32_t>(), f32(c.k), f32(1),
                          f32(c.k * c.I + c.Is)};
}

// One case of the fused-kernel tests: both backends and the weights on both sides (st owns the host tensors, so it
// is declared before them).
struct FusedCase {
  std::unique_ptr<CudaBackend> gpu = test::make_gpu();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  test::OwnedStorage st;
  MoeWeights hw, dw;
  ModelConfig cfg;
};
// Router rows made equal, so that logits tie exactly (the same codes, scales and biases give the same bits on every
// path): ties 1: row e >= E / 2 is row e - E / 2 (pairs); ties 2: row e is row e % 3 (three values, each ~E / 3
// times, so that the top k is decided by the lower-index rule alone).
void tie_router_rows(LinearWeight& r, int ties) {
  if (ties == 0) return;
  const int64_t E = r.out, H = r.in, wpr = H * r.bits / 32, gpr = H / r.group_size;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t src = ties == 1 ? (e >= E / 2 ? e - E / 2 : e) : e % 3;
    if (src == e) continue;
    std::copy_n(r.w.ptr<uint32_t>() + src * wpr, wpr, r.w.ptr<uint32_t>() + e * wpr);
    std::copy_n(r.scales.ptr<uint16_t>() + src * gpr, gpr, r.scales.ptr<uint16_t>() + e * gpr);
    std::copy_n(r.biases.ptr<uint16_t>() + src * gpr, gpr, r.biases.ptr<uint16_t>() + e * gpr);
  }
}

std::unique_ptr<FusedCase> fused_case(const MoeCase& c, uint64_t seed, int ties = 0) {
  auto f = std::make_unique<FusedCase>();
  f->hw = make_moe(f->st, c, seed);
  tie_router_rows(f->hw.router, ties);
  f->dw = test::to_device(*f->gpu, f->hw);
  f->cfg = moe_config(c);
  return f;
}

// The one-launch decode MoE (moe_fused.cu) called directly, so that a silent fall-back to the three launches
// cannot pass for it: per case, four tokens one after another on the same counters (the handoff counters alternate
// between two pairs by epoch parity, so four calls run each pair twice), each against the CPU backend, and the
// experts it chose against the three-launch router's. Shapes: the real one; a 4-bit router; an awkward small one
// (E 40, k 5, widths of 10 and 6 chunks: most lanes idle); 2 passes per gate/up and router row (H 4096); 2 passes per
// down row (k 8 x I 1024: 272 chunks > 5 x 32); 600 experts (the 32-values-per-lane top-k). Both block sizes
// (FERN_CUDA_MOE_WIDE: 256 threads, two blocks per SM; 512 threads, one).
TEST(CudaMoe, FusedDecodeMatchesCpu) {
  FERN_REQUIRE_GPU();
  const MoeCase cases[] = {
      {"fused real", 256, 2048, 512, 512, 8, 4, 1},
      {"fused 4-bit router", 128, 1024, 256, 512, 8, 4, 1, 4},
      {"fused small odd", 40, 320, 192, 64, 5, 4, 1},
      {"fused wide H", 16, 4096, 256, 256, 4, 4, 1},
      {"fused wide down", 64, 1024, 1024, 512, 8, 4, 1},
      {"fused 600 experts", 600, 256, 64, 64, 10, 4, 1},
  };
  for (const char* wide : {"0", "1"})
  for (const MoeCase& c : cases) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string(c.name) + " FERN_CUDA_MOE_WIDE=" + wide);
    const uint64_t seed = uint64_t(c.E * 7 + c.H + c.I);
    const auto f = fused_case(c, seed);
    CudaBackend* gpu = f->gpu.get();
    Backend* cpu = f->cpu.get();
    const MoeWeights &hw = f->hw, &dw = f->dw;
    const ModelConfig& cfg = f->cfg;
    const cuda::Ctx ctx = fused_ctx(*gpu);
    const cuda::MoeScratch s = fused_scratch(*gpu, c);
    Tensor ids(s.topk_ids, DType::I32, {c.k}, Device::Cuda), ids3 = gpu->alloc(DType::I32, {c.k});
    cuda::MoeScratch s3 = s;
    s3.topk_ids = ids3.ptr<int32_t>();
    cuda::Ctx ctx3 = ctx;
    ctx3.n_counters = 0;  // the three-launch router
    for (int rep = 0; rep < 4; ++rep) {
      auto x = test::randn(size_t(c.H), seed + 100 + rep);
      std::vector<float> ref(size_t(c.H));
      cpu->begin_forward();
      cpu->moe(test::host_f32(ref, {1, c.H}), test::host_f32(x, {1, c.H}), hw, cfg);
      Tensor dx = test::upload_f32(*gpu, x, {1, c.H});
      Tensor dy = gpu->alloc(DType::F32, {1, c.H});
      ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), dx.ptr<float>(), s, dy.ptr<float>(), c.k));
      auto got = test::download(*gpu, dy);
      const double e = test::nmse(got.data(), ref.data(), got.size());
      std::printf("moe %-18s E=%ld H=%ld I=%ld Is=%ld k=%d wide %s call %d  NMSE %.3e\n", c.name, long(c.E),
                  long(c.H), long(c.I), long(c.Is), c.k, wide, rep, e);
      EXPECT_LT(e, kNmse);  // the same threshold as the three-launch path (run_case)
      cuda::moe_route(ctx3, cuda::make_qw(dw.router), cuda::make_qw(dw.shared_expert_gate), dx.ptr<float>(), s3, 1, c.k);
      std::vector<int32_t> a(size_t(c.k)), b(size_t(c.k));
      gpu->copy(Tensor(a.data(), DType::I32, {c.k}, Device::Host), ids);
      gpu->copy(Tensor(b.data(), DType::I32, {c.k}, Device::Host), ids3);
      EXPECT_EQ(a, b);
    }
  }
}

// Exactly tied router logits (tie_router_rows): the fused launch's top-k must pick the lower expert among equal
// logits and order the slots as the three-launch router does (topk.cuh, the CPU's rule), at the real shape (8 keys
// per lane, the lean form's rounds) and at k = 10 over 600 experts (the generic rounds). The ties are checked
// to be there: some chosen expert's logit equals another expert's bit for bit.
TEST(CudaMoe, FusedDecodeTopkTies) {
  FERN_REQUIRE_GPU();
  const MoeCase cases[] = {{"ties real", 256, 2048, 512, 512, 8, 4, 1}, {"ties 600", 600, 256, 64, 64, 10, 4, 1}};
  for (const char* wide : {"0", "1"})
  for (const MoeCase& c : cases)
  for (int ties : {1, 2}) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string(c.name) + " ties " + std::to_string(ties) + " FERN_CUDA_MOE_WIDE=" + wide);
    const uint64_t seed = uint64_t(c.E * 5 + ties);
    const auto f = fused_case(c, seed, ties);
    CudaBackend* gpu = f->gpu.get();
    const cuda::Ctx ctx = fused_ctx(*gpu);
    const cuda::MoeScratch s = fused_scratch(*gpu, c);
    Tensor ids3 = gpu->alloc(DType::I32, {c.k});
    cuda::MoeScratch s3 = s;
    s3.topk_ids = ids3.ptr<int32_t>();
    cuda::Ctx ctx3 = ctx;
    ctx3.n_counters = 0;  // the three-launch router
    auto x = test::randn(size_t(c.H), seed + 100);
    std::vector<float> ref(size_t(c.H));
    f->cpu->begin_forward();
    f->cpu->moe(test::host_f32(ref, {1, c.H}), test::host_f32(x, {1, c.H}), f->hw, f->cfg);
    Tensor dx = test::upload_f32(*gpu, x, {1, c.H});
    Tensor dy = gpu->alloc(DType::F32, {1, c.H});
    ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(f->dw), dx.ptr<float>(), s, dy.ptr<float>(), c.k));
    std::vector<int32_t> a(size_t(c.k)), b(size_t(c.k));
    gpu->copy(Tensor(a.data(), DType::I32, {c.k}, Device::Host), Tensor(s.topk_ids, DType::I32, {c.k}, Device::Cuda));
    const auto logits = test::download(*gpu, Tensor(s.router_logits, DType::F32, {c.E}, Device::Cuda));
    const auto got = test::download(*gpu, dy);
    cuda::moe_route(ctx3, cuda::make_qw(f->dw.router), cuda::make_qw(f->dw.shared_expert_gate), dx.ptr<float>(), s3, 1,
                    c.k);
    gpu->copy(Tensor(b.data(), DType::I32, {c.k}, Device::Host), ids3);
    EXPECT_EQ(a, b);
    int tied = 0;  // chosen experts whose logit another expert has too
    for (int32_t id : a) {
      ASSERT_TRUE(id >= 0 && id < c.E);
      for (int64_t e = 0; e < c.E; ++e)
        if (e != id && std::bit_cast<uint32_t>(logits[size_t(e)]) == std::bit_cast<uint32_t>(logits[size_t(id)])) {
          ++tied;
          break;
        }
    }
    EXPECT_GT(tied, 1) << "the router rows should tie";
    const double e = test::nmse(got.data(), ref.data(), got.size());
    std::printf("moe %-10s ties %d wide %s  ids %d..%d (%d tied)  NMSE %.3e\n", c.name, ties, wide, a.front(),
                a.back(), tied, e);
    EXPECT_LT(e, kNmse);
  }
}

// The experts' scales and biases loaded as packed words (FERN_CUDA_MOE_SB=all, the default: the gate/up rows' 32
// scales and 32 biases per 2,048 weights one word per lane, docs/notes/cuda-decode-v20-burst.md, and each down row's
// 8 scales and 8 biases as 8 words of its half-warp, docs/notes/cuda-decode-v22-fastdiv.md; row: the gate/up rows
// only) against two 2-byte loads per chunk (chunk): the same values through the same arithmetic, so the same bits
// are required of the three forms, and each against the CPU. The real shape takes both packings, with k = 10 in
// two down passes (176 items); I 256 only the gate/up one; H 1024 and the odd shape (I 192: six chunks per down
// row, FastDiv by divisors that are not powers of two) neither (they must fall back to chunk loads, and match too).
// Each form also with FERN_CUDA_MOE_LEAN=0 (the generic kernel, where the default compiles the packed forms lean:
// one row pass, the 8-per-lane top-k, single-trip task loops; k10 does not fit the lean kernel's one down pass and
// takes the generic one either way). Both block sizes; an unknown value is an error naming the switch.
TEST(CudaMoe, FusedDecodePackedScalesSameBits) {
  FERN_REQUIRE_GPU();
  const MoeCase cases[] = {
      {"fused real", 256, 2048, 512, 512, 8, 4, 1},
      {"fused real k10", 256, 2048, 512, 512, 10, 4, 1},
      {"fused I 256", 64, 2048, 256, 512, 8, 4, 1},
      {"fused H 1024", 128, 1024, 256, 512, 8, 4, 1},
      {"fused small odd", 40, 320, 192, 64, 5, 4, 1},
  };
  const char* const forms[] = {"chunk", "row", "all"};
  const int packing[][3] = {{0, 1, 2}, {0, 1, 2}, {0, 1, 1}, {0, 0, 0}, {0, 0, 0}};  // per case and form
  for (const char* wide : {"0", "1"})
  for (const MoeCase& c : cases) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string(c.name) + " FERN_CUDA_MOE_WIDE=" + wide);
    const uint64_t seed = uint64_t(c.E * 11 + c.H);
    const auto f = fused_case(c, seed);
    CudaBackend* gpu = f->gpu.get();
    Backend* cpu = f->cpu.get();
    const MoeWeights &hw = f->hw, &dw = f->dw;
    const ModelConfig& cfg = f->cfg;
    const cuda::Ctx ctx = fused_ctx(*gpu);
    const cuda::MoeScratch s = fused_scratch(*gpu, c);
    for (int rep = 0; rep < 2; ++rep) {
      auto x = test::randn(size_t(c.H), seed + 50 + rep);
      std::vector<float> ref(size_t(c.H));
      cpu->begin_forward();
      cpu->moe(test::host_f32(ref, {1, c.H}), test::host_f32(x, {1, c.H}), hw, cfg);
      Tensor dx = test::upload_f32(*gpu, x, {1, c.H});
      std::vector<float> got[3][2];  // [form][FERN_CUDA_MOE_LEAN]
      for (int form = 0; form < 3; ++form)
        for (int lean = 1; lean >= 0; --lean) {
          test::EnvGuard sb("FERN_CUDA_MOE_SB", forms[form]);
          test::EnvGuard ln("FERN_CUDA_MOE_LEAN", lean ? "1" : "0");
          EXPECT_EQ(cuda::moe_fused_packing(ctx, cuda::make_moe_qw(dw), c.k), packing[&c - cases][form]) << forms[form];
          Tensor dy = gpu->alloc(DType::F32, {1, c.H});
          ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), dx.ptr<float>(), s, dy.ptr<float>(), c.k));
          got[form][lean] = test::download(*gpu, dy);
          const double e = test::nmse(got[form][lean].data(), ref.data(), ref.size());
          std::printf("moe %-15s wide %s FERN_CUDA_MOE_SB=%-5s LEAN=%d call %d  NMSE %.3e\n", c.name, wide,
                      forms[form], lean, rep, e);
          EXPECT_LT(e, kNmse);
          EXPECT_EQ(got[0][1], got[form][lean]) << "call " << rep << " form " << form << " lean " << lean;
        }
    }
    test::EnvGuard bad("FERN_CUDA_MOE_SB", "word");
    Tensor dx = gpu->alloc(DType::F32, {1, c.H}), dy = gpu->alloc(DType::F32, {1, c.H});
    try {
      cuda::moe_fused(ctx, cuda::make_moe_qw(dw), dx.ptr<float>(), s, dy.ptr<float>(), c.k);
      ADD_FAILURE() << "FERN_CUDA_MOE_SB=word was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("FERN_CUDA_MOE_SB"), std::string::npos) << e.what();
    }
  }
}

// An unknown block shape is an error naming the switch, not a silent default.
TEST(CudaMoe, FusedDecodeRefusesUnknownShape) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  test::OwnedStorage st;
  const MoeCase c{"fused real", 256, 2048, 512, 512, 8, 4, 1};
  MoeWeights dw = test::to_device(*gpu, make_moe(st, c, 3));
  const cuda::Ctx ctx = fused_ctx(*gpu);
  const cuda::MoeScratch s = fused_scratch(*gpu, c);
  Tensor dx = gpu->alloc(DType::F32, {1, c.H}), dy = gpu->alloc(DType::F32, {1, c.H});
  for (const char* bad : {"2", "half"}) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", bad);
    try {
      cuda::moe_fused(ctx, cuda::make_moe_qw(dw), dx.ptr<float>(), s, dy.ptr<float>(), c.k);
      ADD_FAILURE() << "FERN_CUDA_MOE_WIDE=" << bad << " was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("FERN_CUDA_MOE_WIDE"), std::string::npos) << e.what();
    }
  }
}

// Formats the fused kernel does not take are refused without a launch (the backend then runs the three launches).
TEST(CudaMoe, FusedDecodeRefusesOtherFormats) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  test::OwnedStorage st;
  for (const MoeCase& c : {MoeCase{"bf16", 32, 512, 128, 128, 8, 16, 1}, MoeCase{"8-bit experts", 32, 512, 128, 128, 8, 8, 1}}) {
    MoeWeights dw = test::to_device(*gpu, make_moe(st, c, 5));
    const cuda::Ctx ctx = fused_ctx(*gpu);
    const cuda::MoeScratch s{};
    EXPECT_FALSE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), nullptr, s, nullptr, c.k)) << c.name;
  }
}

// Norm weights around 1 (as trained RMSNorm weights are), so that the normed row is not the input itself.
std::vector<float> norm_weights(int64_t H, uint64_t seed) {
  auto nw = test::randn(size_t(H), seed, 0.3f);
  for (float& v : nw) v += 1.0f;
  return nw;
}

// The CPU reference of moe_residual: resid += delta, xn = RMSNorm(resid) * nw, out = MoE(xn); r is resid + delta.
struct ResidualRef {
  std::vector<float> r, xn, out;
};
ResidualRef cpu_moe_residual(Backend& cpu, const MoeWeights& hw, const ModelConfig& cfg, const std::vector<float>& resid,
                             std::vector<float> delta, std::vector<float> nw, float eps) {
  const int64_t H = int64_t(resid.size());
  ResidualRef ref{resid, std::vector<float>(size_t(H)), std::vector<float>(size_t(H))};
  cpu.begin_forward();
  cpu.add_rmsnorm(test::host_f32(ref.r, {1, H}), test::host_f32(delta, {1, H}), test::host_f32(ref.xn, {1, H}),
                  test::host_f32(nw, {H}), eps);
  cpu.moe(test::host_f32(ref.out, {1, H}), test::host_f32(ref.xn, {1, H}), hw, cfg);
  return ref;
}

// The fused kernel's norm arguments over device rows (resid and delta [1, H], the norm weight, the normed row out).
cuda::MoeNorm fused_norm(Tensor& dr, Tensor& dd, Tensor& dnw, float eps, Tensor* dxn) {
  cuda::MoeNorm n;
  n.resid = dr.ptr<float>();
  n.delta = dd.ptr<float>();
  n.w = dnw.ptr<float>();
  n.eps = eps;
  n.xn = dxn != nullptr ? dxn->ptr<float>() : nullptr;
  n.add_out = dxn != nullptr;
  return n;
}

// The fused kernel with the residual stream (moe_residual: resid += delta, x = RMSNorm(resid), out = MoE(x),
// resid += out), the output written over delta as the forward pass does, against the CPU backend's add_rmsnorm,
// moe and add: the MoE output, the final residual and the normed row. Twice per case (both counter pairs). The norm
// is exact up to fp32 rounding of one sum (the previous version of this test measured 0 on the H200); the MoE output
// has the threshold of run_case. The first call runs the kernel directly, the second through
// CudaBackend::moe_residual. Both block sizes, as above.
TEST(CudaMoe, FusedDecodeWithResidual) {
  FERN_REQUIRE_GPU();
  const MoeCase cases[] = {
      {"norm real", 256, 2048, 512, 512, 8, 4, 1},
      {"norm small odd", 40, 320, 192, 64, 5, 4, 1},
  };
  for (const char* wide : {"0", "1"})
  for (const MoeCase& c : cases) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string(c.name) + " FERN_CUDA_MOE_WIDE=" + wide);
    const uint64_t seed = uint64_t(c.E * 5 + c.H);
    const auto f = fused_case(c, seed);
    CudaBackend* gpu = f->gpu.get();
    Backend* cpu = f->cpu.get();
    const MoeWeights &hw = f->hw, &dw = f->dw;
    const ModelConfig& cfg = f->cfg;
    const float eps = 1e-6f;
    const auto nw = norm_weights(c.H, seed + 1);
    Tensor dnw = test::upload_f32(*gpu, nw, {c.H});
    for (int rep = 0; rep < 2; ++rep) {
      auto resid = test::randn(size_t(c.H), seed + 10 + rep), delta = test::randn(size_t(c.H), seed + 20 + rep, 0.5f);
      const ResidualRef ref = cpu_moe_residual(*cpu, hw, cfg, resid, delta, nw, eps);
      const std::vector<float>& xn_cpu = ref.xn;
      const std::vector<float>& out_cpu = ref.out;
      std::vector<float> r_cpu = ref.r;
      for (int64_t i = 0; i < c.H; ++i) r_cpu[size_t(i)] += out_cpu[size_t(i)];
      gpu->begin_forward();
      Tensor dr = test::upload_f32(*gpu, resid, {1, c.H}), dd = test::upload_f32(*gpu, delta, {1, c.H});
      Tensor dxn = gpu->alloc(DType::F32, {1, c.H});
      if (rep == 0) {
        // Directly, so that a fall-back to add_rmsnorm + moe cannot pass for the fused kernel.
        const cuda::Ctx ctx = fused_ctx(*gpu);
        const cuda::MoeScratch s = fused_scratch(*gpu, c);
        const cuda::MoeNorm n = fused_norm(dr, dd, dnw, eps, &dxn);
        ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), nullptr, s, dd.ptr<float>(), c.k, &n));
      } else {
        gpu->moe_residual(dr, dd, dxn, dnw, eps, dd, dw, cfg);  // the backend op the forward pass calls
      }
      const auto out = test::download(*gpu, dd), r = test::download(*gpu, dr), xn = test::download(*gpu, dxn);
      const double e_out = test::nmse(out.data(), out_cpu.data(), out.size());
      const double e_r = test::nmse(r.data(), r_cpu.data(), r.size());
      const double e_xn = test::nmse(xn.data(), xn_cpu.data(), xn.size());
      std::printf("moe %-18s wide %s call %d  NMSE out %.3e resid %.3e xn %.3e\n", c.name, wide, rep, e_out, e_r,
                  e_xn);
      EXPECT_LT(e_out, kNmse);
      // resid + delta is exact (the same fp32 add); adding the MoE output carries its error, scaled down by the
      // residual's larger norm: below the MoE threshold.
      EXPECT_LT(e_r, kNmse);
      // The sum of squares in another order: relative error ~1e-7 in the scale, NMSE ~1e-14; a wrong weight or
      // eps gives > 1e-6.
      EXPECT_LT(e_xn, 1e-10);
    }
  }
}

// The experts' gate/up rows against the normed row as three 8-bit digits per value (FERN_CUDA_MOE_Q8=1: integer
// dot products; the digits' error is below 2^-17 of the row's scale sx = max |x| / 127, ~6e-8 of its largest value:
// NMSE ~1e-13 expected, a wrong digit layout or scale gives > 1e-3) against the CPU backend, with the residual
// stream as the forward pass calls it. Also a row with one value 300x the others (the scale is the row's maximum:
// the other values keep ~2^-24 x 300 of their size), and a second call per case (both counter pairs). The digit
// form must really run: its output differs in bits from the fp32 form's (same experts, other rounding), while the
// normed row and the routing are the same. Only the lean real shape takes it; the odd shape falls back to the fp32
// form with the same bits. An unknown value is an error naming the switch, whatever the shape.
TEST(CudaMoe, FusedDecodeDigitsMatchCpu) {
  FERN_REQUIRE_GPU();
  struct DigitCase {
    MoeCase c;
    bool taken;
    float outlier;  // delta[7] scaled by this (1: none)
  };
  const DigitCase cases[] = {
      {{"digits real", 256, 2048, 512, 512, 8, 4, 1}, true, 1.0f},
      {{"digits outlier", 256, 2048, 512, 512, 8, 4, 1}, true, 300.0f},
      {{"digits small odd", 40, 320, 192, 64, 5, 4, 1}, false, 1.0f},
  };
  for (const char* wide : {"0", "1"})
  for (const DigitCase& dc : cases) {
    const MoeCase& c = dc.c;
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string(c.name) + " FERN_CUDA_MOE_WIDE=" + wide);
    const uint64_t seed = uint64_t(c.E * 3 + c.H) + uint64_t(dc.outlier);
    const auto f = fused_case(c, seed);
    CudaBackend* gpu = f->gpu.get();
    Backend* cpu = f->cpu.get();
    const MoeWeights &hw = f->hw, &dw = f->dw;
    const ModelConfig& cfg = f->cfg;
    const float eps = 1e-6f;
    const auto nw = norm_weights(c.H, seed + 1);
    Tensor dnw = test::upload_f32(*gpu, nw, {c.H});
    const cuda::Ctx ctx = fused_ctx(*gpu);
    const cuda::MoeScratch s = fused_scratch(*gpu, c);
    for (int rep = 0; rep < 2; ++rep) {
      auto resid = test::randn(size_t(c.H), seed + 10 + rep), delta = test::randn(size_t(c.H), seed + 20 + rep, 0.5f);
      delta[7] *= dc.outlier;
      const std::vector<float> out_cpu = cpu_moe_residual(*cpu, hw, cfg, resid, delta, nw, eps).out;
      std::vector<float> out[2], xn[2];
      std::vector<int32_t> ids[2];
      for (int q8 = 0; q8 < 2; ++q8) {
        test::EnvGuard d("FERN_CUDA_MOE_Q8", q8 ? "1" : "0");
        Tensor dr = test::upload_f32(*gpu, resid, {1, c.H}), dd = test::upload_f32(*gpu, delta, {1, c.H});
        Tensor dxn = gpu->alloc(DType::F32, {1, c.H});
        const cuda::MoeNorm n = fused_norm(dr, dd, dnw, eps, &dxn);
        ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), nullptr, s, dd.ptr<float>(), c.k, &n));
        out[q8] = test::download(*gpu, dd);
        xn[q8] = test::download(*gpu, dxn);
        ids[q8].resize(size_t(c.k));
        gpu->copy(Tensor(ids[q8].data(), DType::I32, {c.k}, Device::Host),
                  Tensor(s.topk_ids, DType::I32, {c.k}, Device::Cuda));
        const double e = test::nmse(out[q8].data(), out_cpu.data(), out_cpu.size());
        std::printf("moe %-18s wide %s FERN_CUDA_MOE_Q8=%d call %d  NMSE out %.3e\n", c.name, wide, q8, rep, e);
        EXPECT_LT(e, kNmse);
      }
      EXPECT_EQ(xn[0], xn[1]);
      EXPECT_EQ(ids[0], ids[1]);
      if (dc.taken) {
        EXPECT_NE(out[0], out[1]) << "the digit form did not run";
      } else {
        EXPECT_EQ(out[0], out[1]) << "the fall-back is the fp32 form";
      }
    }
    test::EnvGuard bad("FERN_CUDA_MOE_Q8", "yes");
    Tensor dr = gpu->alloc(DType::F32, {1, c.H}), dd = gpu->alloc(DType::F32, {1, c.H});
    const cuda::MoeNorm n = fused_norm(dr, dd, dnw, eps, nullptr);
    try {
      cuda::moe_fused(ctx, cuda::make_moe_qw(dw), nullptr, s, dd.ptr<float>(), c.k, &n);
      ADD_FAILURE() << "FERN_CUDA_MOE_Q8=yes was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("FERN_CUDA_MOE_Q8"), std::string::npos) << e.what();
    }
  }
}

// Where the routing weights are computed (FERN_CUDA_MOE_ROUTE=late, the default: warp 0 writes the expert tables
// from its registers and the weights after its gate/up rows are requested; early: with the choice, tables from
// shared memory). The same function of the same keys, so the same bits are required: the output, the residual,
// and the routing decision block 0 publishes (ids, weights, the shared gate), with the real shape (the lean digit
// form takes late) in both block sizes, against the CPU too; the odd shape takes early either way. An unknown value
// is an error naming the switch.
TEST(CudaMoe, FusedDecodeRouteLateSameBits) {
  FERN_REQUIRE_GPU();
  const MoeCase cases[] = {
      {"route real", 256, 2048, 512, 512, 8, 4, 1},
      {"route small odd", 40, 320, 192, 64, 5, 4, 1},
  };
  for (const char* wide : {"0", "1"})
  for (const MoeCase& c : cases) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string(c.name) + " FERN_CUDA_MOE_WIDE=" + wide);
    const uint64_t seed = uint64_t(c.E * 19 + c.H);
    const auto f = fused_case(c, seed);
    CudaBackend* gpu = f->gpu.get();
    Backend* cpu = f->cpu.get();
    const float eps = 1e-6f;
    const auto nw = norm_weights(c.H, seed + 1);
    Tensor dnw = test::upload_f32(*gpu, nw, {c.H});
    const cuda::Ctx ctx = fused_ctx(*gpu);
    const cuda::MoeScratch s = fused_scratch(*gpu, c);
    const auto resid = test::randn(size_t(c.H), seed + 2), delta = test::randn(size_t(c.H), seed + 3, 0.5f);
    const std::vector<float> out_cpu = cpu_moe_residual(*cpu, f->hw, f->cfg, resid, delta, nw, eps).out;
    const char* const forms[] = {"early", "late"};
    std::vector<float> out[2], r[2], w[2], sg[2];
    std::vector<int32_t> ids[2];
    for (int form = 0; form < 2; ++form) {
      test::EnvGuard m("FERN_CUDA_MOE_ROUTE", forms[form]);
      Tensor dr = test::upload_f32(*gpu, resid, {1, c.H}), dd = test::upload_f32(*gpu, delta, {1, c.H});
      Tensor dxn = gpu->alloc(DType::F32, {1, c.H});
      const cuda::MoeNorm n = fused_norm(dr, dd, dnw, eps, &dxn);
      ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(f->dw), nullptr, s, dd.ptr<float>(), c.k, &n));
      out[form] = test::download(*gpu, dd);
      r[form] = test::download(*gpu, dr);
      w[form] = test::download(*gpu, Tensor(s.topk_w, DType::F32, {c.k}, Device::Cuda));
      sg[form] = test::download(*gpu, Tensor(s.sgate, DType::F32, {1}, Device::Cuda));
      ids[form].resize(size_t(c.k));
      gpu->copy(Tensor(ids[form].data(), DType::I32, {c.k}, Device::Host),
                Tensor(s.topk_ids, DType::I32, {c.k}, Device::Cuda));
      const double e = test::nmse(out[form].data(), out_cpu.data(), out_cpu.size());
      std::printf("moe %-16s wide %s FERN_CUDA_MOE_ROUTE=%-5s NMSE out %.3e\n", c.name, wide, forms[form], e);
      EXPECT_LT(e, kNmse);
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(r[0], r[1]);
    EXPECT_EQ(w[0], w[1]);
    EXPECT_EQ(sg[0], sg[1]);
    EXPECT_EQ(ids[0], ids[1]);
    float wsum = 0.0f;
    for (float x : w[1]) wsum += x;
    EXPECT_NEAR(wsum, 1.0f, 1e-5f);  // the weights are really there (renormalised over the chosen experts)
    test::EnvGuard bad("FERN_CUDA_MOE_ROUTE", "soon");
    Tensor dr = gpu->alloc(DType::F32, {1, c.H}), dd = gpu->alloc(DType::F32, {1, c.H});
    const cuda::MoeNorm n = fused_norm(dr, dd, dnw, eps, nullptr);
    try {
      cuda::moe_fused(ctx, cuda::make_moe_qw(f->dw), nullptr, s, dd.ptr<float>(), c.k, &n);
      ADD_FAILURE() << "FERN_CUDA_MOE_ROUTE=soon was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("FERN_CUDA_MOE_ROUTE"), std::string::npos) << e.what();
    }
  }
}

// The MoE's router in the mixer's output projection (kernels.h RouteFold, FERN_CUDA_MOE_FOLD). linear_fold must add
// the projection's output y to resid with the bits of the unfolded add (resid + y in fp32) and leave the router's
// fixed-point pre-logits sum_n R[e][n] nw[n] (resid + y)[n], checked against a double sum over the dequantized router
// on the host: fp32 products and 16-term partial sums per block, then exact integer sums, so ~1e-7 of the terms'
// absolute sum; the bound 1e-6 of it still catches a wrong code, scale, row or column (errors >= 1e-3 of it). Then
// moe_fused with MoeNorm::pre must choose the experts of the unfolded launch on the same resid and y, give its output
// within run_case's NMSE of the CPU backend's moe_residual (and the normed row within FusedDecodeWithResidual's),
// add its output to resid, and leave pre zero for the next projection. Three calls per block size (both counter
// pairs; pre reused after the MoE zeroed it); an odd shape is refused by moe_fused_fold_ok.
TEST(CudaMoe, FusedDecodeFoldMatchesCpu) {
  FERN_REQUIRE_GPU();
  const MoeCase c{"fold real", 256, 2048, 512, 512, 8, 4, 1};
  constexpr int64_t K = 4096;  // the projection's width (GDN value dim; attention heads x head dim)
  for (int ties : {0, 1})  // 1: exactly tied pre-logits (tie_router_rows), the fold's top-k as the unfolded launch's
  for (const char* wide : {"0", "1"}) {
    test::EnvGuard g("FERN_CUDA_MOE_WIDE", wide);
    SCOPED_TRACE(std::string("FERN_CUDA_MOE_WIDE=") + wide + " ties " + std::to_string(ties));
    const uint64_t seed = 977;
    const auto f = fused_case(c, seed, ties);
    CudaBackend* gpu = f->gpu.get();
    const MoeWeights &hw = f->hw, &dw = f->dw;
    const LinearWeight ho = test::raw_affine(f->st, "o_proj", 0, c.H, K, 4, 64, seed + 50, 0.01f, 0.02f);
    const LinearWeight dov = gpu->to_device(ho);
    const float eps = 1e-6f;
    const auto nw = norm_weights(c.H, seed + 1);
    Tensor dnw = test::upload_f32(*gpu, nw, {c.H});
    const cuda::Ctx ctx = fused_ctx(*gpu);
    ASSERT_TRUE(cuda::moe_fused_fold_ok(ctx, cuda::make_moe_qw(dw), c.k));
    const cuda::MoeScratch s = fused_scratch(*gpu, c);
    Tensor dpack = gpu->alloc(DType::U8, {int64_t(cuda::route_fold_pack_bytes(cuda::make_qw(dw.router)))});
    cuda::route_fold_pack(ctx, cuda::make_qw(dw.router), cuda::make_qw(dw.shared_expert_gate), dpack.data);
    const int64_t npre = (c.E + 1) * cuda::kFoldStride;
    Tensor dpre = gpu->alloc(DType::I64, {npre});
    std::vector<long long> pre_h(size_t(npre), 0);
    gpu->copy(dpre, Tensor(pre_h.data(), DType::I64, {npre}, Device::Host));
    // The router and shared-expert gate rows dequantized on the host (8-bit codes: byte n of a row is column n).
    auto deq = [&](const LinearWeight& w, int64_t r, int64_t n) {
      const uint32_t word = w.w.ptr<uint32_t>()[(r * c.H + n) / 4];
      const double q = double((word >> (8 * (n % 4))) & 0xffu);
      const int64_t gi = r * (c.H / 64) + n / 64;
      return double(bf16_to_f32(w.scales.ptr<uint16_t>()[gi])) * q + double(bf16_to_f32(w.biases.ptr<uint16_t>()[gi]));
    };
    for (int rep = 0; rep < 3; ++rep) {
      const auto a = test::randn(size_t(K), seed + 60 + rep), resid = test::randn(size_t(c.H), seed + 70 + rep);
      Tensor da = test::upload_f32(*gpu, a, {1, K}), dr = test::upload_f32(*gpu, resid, {1, c.H});
      Tensor dy = gpu->alloc(DType::F32, {1, c.H}), dxn = gpu->alloc(DType::F32, {1, c.H});
      cuda::RouteFold fold;
      fold.router = cuda::make_qw(dw.router);
      fold.sgr = cuda::make_qw(dw.shared_expert_gate);
      fold.norm_w = dnw.ptr<float>();
      fold.resid = dr.ptr<float>();
      fold.pre = dpre.ptr<long long>();
      fold.packed = dpack.data;
      ASSERT_TRUE(cuda::route_fold_ok(cuda::make_qw(dov), fold));
      cuda::linear_fold(ctx, cuda::make_qw(dov), da.ptr<float>(), dy.ptr<float>(), fold);
      const auto y = test::download(*gpu, dy), r = test::download(*gpu, dr);
      gpu->copy(Tensor(pre_h.data(), DType::I64, {npre}, Device::Host), dpre);
      std::vector<float> r_want(size_t(c.H));
      for (int64_t i = 0; i < c.H; ++i) r_want[size_t(i)] = resid[size_t(i)] + y[size_t(i)];
      EXPECT_TRUE(test::same_bits(r, r_want)) << "resid + y";
      double worst = 0.0;
      for (int64_t e = 0; e <= c.E; ++e) {
        double want = 0.0, mag = 0.0;
        for (int64_t n = 0; n < c.H; ++n) {
          const double t = (e < c.E ? deq(hw.router, e, n) : deq(hw.shared_expert_gate, 0, n)) * double(nw[size_t(n)]) *
                           double(r_want[size_t(n)]);
          want += t;
          mag += std::fabs(t);
        }
        const double got = double(pre_h[size_t(e * cuda::kFoldStride)]) / double(cuda::kFoldUnit);
        worst = std::max(worst, std::fabs(got - want) / mag);
      }
      std::printf("fold wide %s call %d  pre-logits worst |error| / sum |terms| %.3e\n", wide, rep, worst);
      EXPECT_LT(worst, 1e-6);

      // The MoE on the folded state, against the CPU and the unfolded launch.
      const ResidualRef ref = cpu_moe_residual(*f->cpu, hw, f->cfg, resid, y, nw, eps);
      Tensor dout = gpu->alloc(DType::F32, {1, c.H});
      cuda::MoeNorm n;
      n.resid = dr.ptr<float>();
      n.w = dnw.ptr<float>();
      n.eps = eps;
      n.xn = dxn.ptr<float>();
      n.add_out = true;
      n.pre = dpre.ptr<long long>();
      ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), nullptr, s, dout.ptr<float>(), c.k, &n));
      const auto out = test::download(*gpu, dout), r2 = test::download(*gpu, dr), xn = test::download(*gpu, dxn);
      std::vector<int32_t> ids(size_t(c.k)), ids_u(size_t(c.k));
      gpu->copy(Tensor(ids.data(), DType::I32, {c.k}, Device::Host),
                Tensor(s.topk_ids, DType::I32, {c.k}, Device::Cuda));
      gpu->copy(Tensor(pre_h.data(), DType::I64, {npre}, Device::Host), dpre);
      EXPECT_TRUE(std::all_of(pre_h.begin(), pre_h.end(), [](long long v) { return v == 0; })) << "pre not zeroed";
      const double e_out = test::nmse(out.data(), ref.out.data(), out.size());
      const double e_xn = test::nmse(xn.data(), ref.xn.data(), xn.size());
      std::printf("fold wide %s call %d  NMSE out %.3e xn %.3e\n", wide, rep, e_out, e_xn);
      EXPECT_LT(e_out, kNmse);
      EXPECT_LT(e_xn, 1e-10);
      std::vector<float> r2_want(size_t(c.H));
      for (int64_t i = 0; i < c.H; ++i) r2_want[size_t(i)] = r[size_t(i)] + out[size_t(i)];
      EXPECT_TRUE(test::same_bits(r2, r2_want)) << "resid + MoE output";

      Tensor dr_u = test::upload_f32(*gpu, resid, {1, c.H}), dd_u = test::upload_f32(*gpu, y, {1, c.H});
      const cuda::MoeNorm nu = fused_norm(dr_u, dd_u, dnw, eps, &dxn);
      ASSERT_TRUE(cuda::moe_fused(ctx, cuda::make_moe_qw(dw), nullptr, s, dd_u.ptr<float>(), c.k, &nu));
      gpu->copy(Tensor(ids_u.data(), DType::I32, {c.k}, Device::Host),
                Tensor(s.topk_ids, DType::I32, {c.k}, Device::Cuda));
      EXPECT_EQ(ids, ids_u);
    }
  }
  // An odd shape: the fold is refused (the forward pass then keeps the router in the MoE launch).
  const MoeCase odd{"fold small odd", 40, 320, 192, 64, 5, 4, 1};
  const auto f = fused_case(odd, 5);
  EXPECT_FALSE(cuda::moe_fused_fold_ok(fused_ctx(*f->gpu), cuda::make_moe_qw(f->dw), odd.k));
}

}  // namespace
}  // namespace fern
