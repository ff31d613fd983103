// The tensor-core multi-row linear (linear_gemm.cu, the prefill path) against the CPU backend's linear(): called
// directly at the real shapes of Qwen3.6-35B-A3B (8192x2048 qkv, 2048x4096 out_proj, 512x2048 and 2048x512
// experts, 8-bit router, the 248320-row lm_head) and at awkward ones (row counts that are not a multiple of the
// 128-row tile, token counts that are not a multiple of the 64- or 128-row tile, T = 2, group 32 and 128, bf16),
// on every tile loop: the precise split loop (no workspace), the fp16 loops (a workspace in the context:
// gemm_f16.h, gemm_tile_f16.cuh) and, on an sm_90a build on a compute-capability 9.0 GPU, the wgmma loop (gemm_wg.h,
// gemm_tile_wg.cuh, and its warp-specialized form, gemm_tile_ws.cuh, bit for bit); rows of very different magnitudes (the per-row fp16 scaling); then through the backend's
// linear()/linear_multi() dispatch (linear_gemm_wins; each FERN_GEMM value), and the widths it must refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <utility>

#include "cuda/gemm_f16.h"
#include "cuda/gemm_wg.h"
#include "cuda/qweight.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

struct Case {
  const char* name;
  int64_t out, in;
  int bits, gs, T;
};

// x enters the MMAs as two bf16 halves (hi + lo, ~2^-17 relative), the weight codes (or bf16 weights) are exact
// in bf16 and every product is exact in fp32; the affine scale and bias are applied per group in fp32. So only
// the fp32 summation order (and the x split's 2^-17) differ from the CPU. Measured on the H200
// (docs/notes/cuda-prefill-v1.md): NMSE 3.1e-12..6.3e-12 (4-bit, 8-bit), 6.1e-12 and 2.6e-11 (bf16); the launches
// are deterministic (no atomics), so these seeds give these values. 1e-9 leaves 40x room over the largest and
// still catches a wrong nibble, group, scale, row or token tile (NMSE > 1e-3) and a plain bf16 rounding of x
// (~3e-6); an unwritten output is NaN and fails too. The wgmma loop (wg) also splits each dequantized weight into
// bf16 hi + lo and drops x_lo w_lo (~2^-17 per product more): measured 1.2e-11 .. 2.1e-10 (the largest: 8-bit,
// group 32, K 4096; docs/notes/cuda-prefill-v4-wg.md), 4.7x under the same limit, which still holds it to the
// split loop's class and far below a bf16 rounding of x or w.
constexpr double kNmse = 1e-9;
// The fp16 loop rounds x (per-row scaled) and every dequantized weight s q + b once to fp16 (11 significant bits,
// relative error up to 2^-11). Measured on the H200 (docs/notes/cuda-prefill-v3-gemm.md): 5.6e-8 .. 1.1e-7 over
// the shapes here, worst single row 1.7e-7 (the magnitudes test). 1e-6 is 6x over the largest and still catches a
// wrong nibble, group, scale, row or tile (NMSE > 1e-3) and a bf16 rounding of x (~1e-6 and more).
constexpr double kNmseF16 = 1e-6;
// FERN_GEMM_WG_PIPE=q4h (the exact-code loop on one fp16 row of x, docs/notes/cuda-prefill-v13-q4h.md): x rounded
// once to fp16 and the codes exact, so at most the fp16 loop's error (which also rounds the weights): kNmseF16.
// Measured on the H200: 4.4e-8 on in_proj_qkv at T = 300.
constexpr double kNmseQ4h = kNmseF16;

struct Fixture {
  std::unique_ptr<CudaBackend> gpu = test::make_gpu();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  test::OwnedStorage st;
};

LinearWeight make_weight(Fixture& s, const Case& c) {
  const uint64_t seed = uint64_t(c.out * 31 + c.in * 7 + c.bits + c.T * 3);
  return c.bits == 16 ? test::raw_dense(s.st, c.name, 0, c.out, c.in, seed)
                      : test::raw_affine(s.st, c.name, 0, c.out, c.in, c.bits, c.gs, seed);
}

std::vector<float> cpu_ref(Fixture& s, const LinearWeight& hw, const std::vector<float>& x, int T) {
  std::vector<float> ref(size_t(T * hw.out), 0.0f);
  std::vector<float> xx = x;
  s.cpu->linear(test::host_f32(ref, {T, hw.out}), test::host_f32(xx, {T, hw.in}), hw);
  return ref;
}

// The tile loops of linear_gemm: the split loop (no workspace), the fp16 loop, the precise fp16 loop (fp16x2), the
// wgmma loop (wg: bf16 hi/lo rows of x and of the weights, three MMAs per step; the split loop's precision, kNmse).
enum class Loop { Split, Fp16, Fp16x2, Wg };
const char* loop_name(Loop l) {
  return l == Loop::Split ? "split" : l == Loop::Fp16 ? "fp16" : l == Loop::Fp16x2 ? "fp16x2" : "wg";
}
// The loops this GPU and build run (wg only on sm_90a code on a compute-capability 9.0 device).
std::vector<Loop> loops() {
  std::vector<Loop> r = {Loop::Split, Loop::Fp16, Loop::Fp16x2};
  if (cuda::gemm_wg_supported()) r.push_back(Loop::Wg);
  else std::printf("gemm: no wgmma on this GPU/build, the wg loop is not tested here\n");
  return r;
}

// A device workspace for the fp16 loops, in a context on the default stream.
struct Workspace {
  Tensor buf;
  cuda::Ctx ctx;
  Workspace(CudaBackend& gpu, int64_t rows, int64_t K, Loop l) {
    if (l == Loop::Split) return;
    ctx.gemm_precise = l == Loop::Fp16x2;
    ctx.gemm_wg = l == Loop::Wg;
    const size_t bytes = ctx.gemm_wg ? cuda::xbf_bytes(rows, K) : cuda::x16_bytes(rows, K, ctx.gemm_precise);
    buf = gpu.alloc(DType::F32, {int64_t((bytes + 3) / 4)});
    ctx.gemm_ws = buf.data;
    ctx.gemm_ws_bytes = bytes;
  }
};

// out (optional) receives the GPU result; limit (if > 0) replaces the loop's bound.
void run_direct(const Case& c, Loop loop, std::vector<float>* out = nullptr, double limit = 0) {
  SCOPED_TRACE(std::string(c.name) + " " + loop_name(loop));
  Fixture s;
  LinearWeight hw = make_weight(s, c);
  LinearWeight dw = s.gpu->to_device(hw);
  const cuda::QW q = cuda::make_qw(dw);
  ASSERT_TRUE(cuda::linear_gemm_ok(q));
  auto x = test::randn(size_t(c.T * c.in), uint64_t(c.out + c.T));
  const auto ref = cpu_ref(s, hw, x, c.T);
  Tensor dx = test::upload_f32(*s.gpu, x, {c.T, c.in});
  Tensor dy = test::nan_filled(*s.gpu, c.T, c.out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // bf16 weights stay on the split loop, and so do widths the wgmma loop refuses
  const Loop took = c.bits == 16 || (loop == Loop::Wg && !cuda::linear_gemm_wg_ok(q)) ? Loop::Split : loop;
  Workspace ws(*s.gpu, c.T, c.in, loop);  // default stream, no PDL
  cuda::linear_gemm(ws.ctx, q, dx.ptr<float>(), dy.ptr<float>(), c.T);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto got = test::download(*s.gpu, dy);
  const double e = test::nmse(got.data(), ref.data(), got.size());
  std::printf("gemm %-6s %-22s [%6ld x %5ld] %2d-bit g%-3d T=%-4d NMSE %.3e\n", loop_name(took), c.name,
              long(c.out), long(c.in), c.bits, c.gs, c.T, e);
  EXPECT_LT(e, limit > 0 ? limit : took == Loop::Fp16 ? kNmseF16 : kNmse);
  if (out != nullptr) *out = std::move(got);
}

void run_direct(const Case& c) {
  for (Loop l : loops()) run_direct(c, l);
}

TEST(CudaLinearGemm, RealShapes) {
  FERN_REQUIRE_GPU();
  for (const Case& c : {Case{"in_proj_qkv", 8192, 2048, 4, 64, 300}, Case{"out_proj", 2048, 4096, 4, 64, 64},
                        Case{"expert gate", 512, 2048, 4, 64, 2048}, Case{"expert down", 2048, 512, 4, 64, 17},
                        Case{"router 8-bit", 256, 2048, 8, 64, 300}, Case{"in_proj_qkv T=2", 8192, 2048, 4, 64, 2},
                        Case{"lm_head", 248320, 2048, 4, 64, 17}, Case{"qkv-width T=1100 tall", 2048, 2048, 4, 64, 1100},
                        Case{"8-bit T=1024 tall", 640, 1024, 8, 64, 1024},
                        // enough blocks for the wgmma loop's 128-token tiles (>= 2 waves), T not a multiple of 128
                        Case{"qkv T=2100 wide tiles", 8192, 2048, 4, 64, 2100},
                        Case{"8-bit T=1100 wide tiles", 8192, 1024, 8, 64, 1100}}) {
    run_direct(c);
    if (!cuda::gemm_wg_supported()) continue;
    // The default wgmma loop is the exact-code one where the format allows (run_direct above, against the CPU). The
    // warp-specialized hi/lo loop issues the synchronous loop's MMAs on the same operands in the same order: the
    // bits must agree, at every tile height and pipeline depth.
    std::vector<float> ws_out, sync_out;
    {
      test::EnvGuard pipe("FERN_GEMM_WG_PIPE", "ws");
      run_direct(c, Loop::Wg, &ws_out);
    }
    {
      // The exact-code loop on fp16 rows of x (4-bit weights; the others fall back to the synchronous loop).
      test::EnvGuard q4h("FERN_GEMM_WG_PIPE", "q4h");
      run_direct(c, Loop::Wg, nullptr, kNmseQ4h);
    }
    {
      // The exact-code loop with the bias term promoted per tile by FMAs on the fp32 sums (q4, opt-in; the default
      // q4b puts it on the tensor cores): exact products, x as bf16 hi + lo: the default loop's kNmse.
      test::EnvGuard q4("FERN_GEMM_WG_PIPE", "q4");
      run_direct(c, Loop::Wg);
    }
    test::EnvGuard pipe("FERN_GEMM_WG_PIPE", "sync");
    run_direct(c, Loop::Wg, &sync_out);
    EXPECT_EQ(ws_out, sync_out) << c.name << ": the warp-specialized and synchronous wgmma loops differ";
    // Both depths of the synchronous loop's 64-token tiles forced (FERN_GEMM_WG_STAGES), on the shapes that take
    // those tiles and are cheap for the CPU reference.
    if (c.out * c.T <= 8192 * 300) {
      for (const char* st : {"2", "4"}) {
        test::EnvGuard g("FERN_GEMM_WG_STAGES", st);
        run_direct(c, Loop::Wg);
      }
    }
  }
}

// Several weight blocks per block on the exact-code loop (FERN_GEMM_SEQ; docs/notes/cuda-prefill-v8-items.md): each
// item runs the same MMAs on the same operands in the same order as a block of its own, so every count gives the
// bits of one block per weight block, also where the last block of a row of blocks holds fewer items (2048 rows =
// 16 weight blocks: 3 leaves one, 5 one, 64 is more than there are). Checked against the CPU as well.
TEST(CudaLinearGemm, WeightBlocksPerBlock) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no wgmma on this GPU/build";
  for (const Case& c : {Case{"out_proj", 2048, 4096, 4, 64, 300}, Case{"qkv T=2100 wide tiles", 8192, 2048, 4, 64, 2100},
                        Case{"odd rows", 1000, 1024, 4, 64, 77}}) {
    std::vector<float> one;
    {
      test::EnvGuard g("FERN_GEMM_SEQ", "1");
      run_direct(c, Loop::Wg, &one);
    }
    for (const char* n : {"2", "3", "5", "64"}) {
      test::EnvGuard g("FERN_GEMM_SEQ", n);
      std::vector<float> got;
      run_direct(c, Loop::Wg, &got);
      EXPECT_EQ(got, one) << c.name << ": FERN_GEMM_SEQ=" << n << " changed the result";
    }
  }
  for (const char* bad : {"0", "65", "2x"}) {
    test::EnvGuard g("FERN_GEMM_SEQ", bad);
    EXPECT_THROW(run_direct(Case{"out_proj", 2048, 4096, 4, 64, 64}, Loop::Wg), Error) << bad;
  }
}

// Rows of very different magnitudes in one call: |x| ~ 1e5 (fp16 overflows at 65504 without the per-row scale),
// ~1e-5 (fp16 subnormals without it: 3 significant bits left) and ~1. Each row is compared with its own CPU row, so
// a small row cannot hide behind the large ones; the limit is the fp16 loop's (kNmseF16).
TEST(CudaLinearGemm, RowsOfVeryDifferentMagnitude) {
  FERN_REQUIRE_GPU();
  for (const int T : {300, 1030}) {
    const Case c{"magnitudes", 1024, 2048, 4, 64, T};
    Fixture s;
    LinearWeight hw = make_weight(s, c);
    LinearWeight dw = s.gpu->to_device(hw);
    const cuda::QW q = cuda::make_qw(dw);
    auto x = test::randn(size_t(c.T * c.in), 91);
    for (int t = 0; t < c.T; ++t) {
      const float f = t % 3 == 0 ? 1e5f : t % 3 == 1 ? 1e-5f : 1.0f;
      for (int64_t i = 0; i < c.in; ++i) x[size_t(t * c.in + i)] *= f;
    }
    const auto ref = cpu_ref(s, hw, x, c.T);
    Tensor dx = test::upload_f32(*s.gpu, x, {c.T, c.in});
    for (Loop l : loops()) {
      Tensor dy = test::nan_filled(*s.gpu, c.T, c.out);
      Workspace ws(*s.gpu, c.T, c.in, l);
      cuda::linear_gemm(ws.ctx, q, dx.ptr<float>(), dy.ptr<float>(), c.T);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto got = test::download(*s.gpu, dy);
      double worst[3] = {0, 0, 0};
      for (int t = 0; t < c.T; ++t) {
        const size_t o = size_t(t) * size_t(c.out);
        const double e = test::nmse(got.data() + o, ref.data() + o, size_t(c.out));
        worst[t % 3] = std::isnan(e) ? INFINITY : std::max(worst[t % 3], e);
      }
      std::printf("gemm %-6s magnitudes T=%-4d worst row NMSE: |x|~1e5 %.3e, ~1e-5 %.3e, ~1 %.3e\n", loop_name(l), T,
                  worst[0], worst[1], worst[2]);
      for (double w : worst) EXPECT_LT(w, l == Loop::Fp16 ? kNmseF16 : kNmse) << loop_name(l) << " T=" << T;
    }
  }
}

TEST(CudaLinearGemm, AwkwardShapes) {
  FERN_REQUIRE_GPU();
  for (const Case& c : {Case{"odd rows", 37, 192, 4, 64, 17}, Case{"group 32", 77, 320, 4, 32, 65},
                        Case{"group 128", 129, 640, 4, 128, 2}, Case{"8-bit group 32", 300, 4096, 8, 32, 64},
                        Case{"8-bit odd", 131, 64, 8, 64, 127}, Case{"bf16", 515, 2048, 16, 0, 17},
                        Case{"bf16 many rows", 33, 128, 16, 0, 2048}, Case{"one row", 1, 2048, 4, 64, 300},
                        // wider than the q4b bias tile (4096): the default pipe takes the q4 form there
                        Case{"4-bit K=8192", 300, 8192, 4, 64, 300}, Case{"4-bit K=4160 group 64", 130, 4160, 4, 64, 129}})
    run_direct(c);
}

// The backend's linear() takes the tensor-core path where linear_gemm_wins (qkv at T = 300), and keeps the GEMV
// for widths the kernel refuses (not a multiple of 64, group 32 over 96).
TEST(CudaLinearGemm, BackendDispatch) {
  FERN_REQUIRE_GPU();
  for (const Case& c : {Case{"dispatch qkv", 8192, 2048, 4, 64, 300}, Case{"dispatch narrow", 77, 96, 4, 32, 40},
                        Case{"dispatch bf16 narrow", 33, 24, 16, 0, 16}}) {
    SCOPED_TRACE(c.name);
    Fixture s;
    LinearWeight hw = make_weight(s, c);
    LinearWeight dw = s.gpu->to_device(hw);
    EXPECT_EQ(cuda::linear_gemm_ok(cuda::make_qw(dw)), c.in % 64 == 0);
    auto x = test::randn(size_t(c.T * c.in), uint64_t(c.out + c.T));
    const auto ref = cpu_ref(s, hw, x, c.T);
    Tensor dx = test::upload_f32(*s.gpu, x, {c.T, c.in});
    Tensor dy = test::nan_filled(*s.gpu, c.T, c.out);
    s.gpu->linear(dy, dx, dw);
    auto got = test::download(*s.gpu, dy);
    const double e = test::nmse(got.data(), ref.data(), got.size());
    std::printf("backend linear %-22s T=%-4d NMSE %.3e\n", c.name, c.T, e);
    EXPECT_LT(e, kNmse);
    if (cuda::linear_gemm_wins(cuda::make_qw(dw), c.T)) {
      // Each FERN_GEMM value: fp16's rounding is visible (split measured ~5e-12, fp16 ~8e-8); fp16x2 and wg are as
      // precise as split but sum in another order (other bits), which shows that they ran.
      std::vector<float> outs[4];
      std::vector<const char*> modes = {"split", "fp16", "fp16x2"};
      if (cuda::gemm_wg_supported()) modes.push_back("wg");
      int i = 0;
      for (const char* mode : modes) {
        Tensor dy2 = test::nan_filled(*s.gpu, c.T, c.out);
        {
          test::EnvGuard g("FERN_GEMM", mode);
          s.gpu->linear(dy2, dx, dw);
        }
        outs[i] = test::download(*s.gpu, dy2);
        const double e2 = test::nmse(outs[i].data(), ref.data(), outs[i].size());
        std::printf("backend linear %-22s T=%-4d FERN_GEMM=%-6s NMSE %.3e\n", c.name, c.T, mode, e2);
        EXPECT_LT(e2, i == 1 ? kNmseF16 : kNmse) << mode;
        if (i == 1) {
          EXPECT_GT(e2, 1e-10) << "FERN_GEMM=fp16 did not take the fp16 loop";
        }
        ++i;
      }
      EXPECT_NE(outs[0], outs[2]) << "FERN_GEMM=fp16x2 did not take the pipelined loop";
      if (modes.size() > 3) {
        EXPECT_NE(outs[0], outs[3]) << "FERN_GEMM=wg did not take the wgmma loop";
      }
    }
  }
}

// linear_multi in prefill: one launch per matrix, each output to its own tensor (at T = 64 the two large matrices
// take the tensor-core kernel, the two 32-row ones the GEMV).
TEST(CudaLinearGemm, BackendMulti) {
  FERN_REQUIRE_GPU();
  Fixture s;
  const int T = 64;
  const int64_t in = 2048;
  const int64_t outs[4] = {8192, 4096, 32, 32};  // the GDN input projections
  std::vector<LinearWeight> hw, dw;
  for (int i = 0; i < 4; ++i) hw.push_back(test::raw_affine(s.st, "gdn." + std::to_string(i), 0, outs[i], in, 4, 64,
                                                            uint64_t(50 + i)));
  for (auto& w : hw) dw.push_back(s.gpu->to_device(w));
  auto x = test::randn(size_t(T * in), 77);
  Tensor dx = test::upload_f32(*s.gpu, x, {T, in});
  std::vector<Tensor> dys;
  std::vector<const LinearWeight*> wp;
  for (int i = 0; i < 4; ++i) {
    dys.push_back(test::nan_filled(*s.gpu, T, outs[i]));
    wp.push_back(&dw[size_t(i)]);
  }
  s.gpu->linear_multi(dys, dx, wp);
  for (int i = 0; i < 4; ++i) {
    const auto ref = cpu_ref(s, hw[size_t(i)], x, T);
    auto got = test::download(*s.gpu, dys[size_t(i)]);
    const double e = test::nmse(got.data(), ref.data(), got.size());
    std::printf("backend linear_multi gdn.%d [%5ld x %ld] T=%d NMSE %.3e\n", i, long(outs[i]), long(in), T, e);
    EXPECT_LT(e, kNmse) << "matrix " << i;
  }
}

TEST(CudaLinearGemm, RefusedShapes) {
  FERN_REQUIRE_GPU();
  cuda::QW q;
  q.out = 64;
  q.in = 96;  // not a multiple of the 64-wide k tile
  q.bits = 4;
  q.gs = 32;
  EXPECT_FALSE(cuda::linear_gemm_ok(q));
  q.in = 128;
  EXPECT_TRUE(cuda::linear_gemm_ok(q));
  q.gs = 8;  // a group narrower than a 16-wide k segment
  EXPECT_FALSE(cuda::linear_gemm_ok(q));
  q.gs = 64;
  q.experts = 4;  // expert stacks go through the MoE kernels
  EXPECT_FALSE(cuda::linear_gemm_ok(q));
  EXPECT_THROW(cuda::linear_gemm(cuda::Ctx{}, q, nullptr, nullptr, 16), Error);
  // The switch point: a grid of at least 64 blocks of 64 x 128 (the micro-benchmark's measured wins).
  q.experts = 0;
  q.in = 2048;
  q.out = 8192;
  EXPECT_TRUE(cuda::linear_gemm_wins(q, 64));    // 1 x 64 blocks
  EXPECT_FALSE(cuda::linear_gemm_wins(q, 15));   // below kGemmMinRows
  q.out = 2048;
  EXPECT_FALSE(cuda::linear_gemm_wins(q, 64));   // 1 x 16 blocks: measured 0.8x of the GEMV
  EXPECT_TRUE(cuda::linear_gemm_wins(q, 256));   // 4 x 16
}

// A mistyped FERN_GEMM is the user's error, named with its value; reading the switch needs no GPU, so this also
// runs where the other tests skip.
// Expects `read` to throw a fern::Error whose message names `setting` (the variable and its value).
template <class F>
void expect_error_naming(F&& read, const std::string& setting) {
  try {
    read();
    ADD_FAILURE() << setting << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(setting), std::string::npos) << e.what();
  }
}

TEST(CudaGemmMode, UnknownValueIsAnError) {
  {
    test::EnvGuard g("FERN_GEMM", "fp8");
    expect_error_naming([] { cuda::gemm_mode(); }, "FERN_GEMM=fp8");
  }
  {
    test::EnvGuard g("FERN_GEMM", "fp16");
    EXPECT_EQ(cuda::gemm_mode(), cuda::GemmMode::Fp16);
  }
  {
    // wg where it runs (an sm_90a build on a compute-capability 9.0 GPU), else a user error naming the value.
    test::EnvGuard g("FERN_GEMM", "wg");
    if (cuda::gemm_wg_supported()) {
      EXPECT_EQ(cuda::gemm_mode(), cuda::GemmMode::Wg);
    } else {
      expect_error_naming([] { cuda::gemm_mode(); }, "FERN_GEMM=wg");
    }
  }
  {
    // The wgmma loop's pipeline switch takes 2 or 4 (unset: the kernels' measured rule); anything else is named.
    test::EnvGuard st("FERN_GEMM_WG_STAGES", "3");
    expect_error_naming([] { cuda::gemm_wg_stages(); }, "FERN_GEMM_WG_STAGES=3");
  }
  {
    test::EnvGuard st("FERN_GEMM_WG_STAGES", nullptr);
    EXPECT_EQ(cuda::gemm_wg_stages(), 0);
  }
  {
    // The wgmma loop's form: q4, q4h, q4b, ws or sync (unset: q4b); anything else is named.
    test::EnvGuard p("FERN_GEMM_WG_PIPE", "async");
    expect_error_naming([] { cuda::gemm_wg_pipe(); }, "FERN_GEMM_WG_PIPE=async");
  }
  for (const auto& [value, pipe] : {std::pair{"q4", cuda::WgPipe::Q4}, std::pair{"q4h", cuda::WgPipe::Q4h},
                                    std::pair{"q4b", cuda::WgPipe::Q4b}, std::pair{"ws", cuda::WgPipe::Ws},
                                    std::pair{"sync", cuda::WgPipe::Sync}}) {
    test::EnvGuard p("FERN_GEMM_WG_PIPE", value);
    EXPECT_EQ(cuda::gemm_wg_pipe(), pipe) << value;
  }
  {
    test::EnvGuard p("FERN_GEMM_WG_PIPE", nullptr);
    EXPECT_EQ(cuda::gemm_wg_pipe(), cuda::WgPipe::Q4b);
  }
  test::EnvGuard g("FERN_GEMM", nullptr);
  // The default: the wgmma loop where it runs, else the split loop (both precise).
  EXPECT_EQ(cuda::gemm_mode(), cuda::gemm_wg_supported() ? cuda::GemmMode::Wg : cuda::GemmMode::Split);
}

}  // namespace
}  // namespace fern
