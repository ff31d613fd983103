// CUDA Gated DeltaNet core against the CPU backend at the real shapes (16 key heads, 32 value heads, 128 dims,
// conv kernel 4) over a sequence of decode steps and multi-row calls, checking every output and the carried
// conv and recurrent states; plus a smaller head count. The same sequence through gdn_core_linear (the forward
// pass's op: the core with out_proj; on the GPU for one row the step kernel's raw output normalised inside the
// out_proj GEMV, linear_gated_norm; for prompt rows the norm computed into the GEMM's rows, gated_norm_xbf_q4)
// against the CPU's gdn_core followed by linear().
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"

namespace fern {
namespace {

// Both sides run the delta rule in fp32 (the CPU in the chunked form for multi-row calls); over 20 steps the
// outputs agree to NMSE 5e-14..7e-14 and the states to 2e-14..4e-14 on the H200. A wrong gate, head mapping or
// norm gives > 1e-3.
constexpr double kNmse = 1e-8;

// with_out_proj: both sides run gdn_core_linear with a random 4-bit out_proj; the projected outputs are compared.
// Their error is the core's (above) plus the GEMV's (NMSE 1.6e-12..3.9e-12 at 4 bits, test_cuda_linear.cpp); the
// same bound. A norm skipped or applied twice gives NMSE ~1.
// Returns every call's output and the final recurrent and conv states, concatenated (for the bit-for-bit test).
// calls: the rows of each call in turn (decode steps and multi-row calls).
std::vector<float> run(int Hk, int Hv, uint64_t seed, bool with_out_proj = false,
                       const std::vector<int>& calls = {1, 1, 1, 1, 1, 1, 5, 1, 3, 1, 1, 1, 1, 1, 1}) {
  std::vector<float> all;
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  ModelConfig cfg;
  cfg.num_hidden_layers = 1;
  cfg.layer_types = {LayerType::LinearAttention};
  cfg.linear_num_key_heads = Hk;
  cfg.linear_num_value_heads = Hv;
  const int64_t C = cfg.gdn_conv_dim(), V = cfg.gdn_value_dim();
  test::OwnedStorage st;
  GdnWeights hw;
  auto vec = [&](int64_t n, float mean, float sd, uint64_t s) {
    Tensor t = st.make(DType::F32, {n});
    auto v = test::randn(size_t(n), s, sd);
    for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = mean + v[i];
    return t;
  };
  hw.conv_w = vec(C * 4, 0.0f, 0.5f, seed + 1).reshape({C, 4});
  hw.A_log = vec(Hv, 0.5f, 0.8f, seed + 2);
  hw.dt_bias = vec(Hv, -1.0f, 0.5f, seed + 3);
  hw.norm_w = vec(128, 1.0f, 0.1f, seed + 4);
  const int64_t H = 2048;
  hw.out_proj = test::raw_affine(st, "out_proj", 0, H, V, 4, 64, seed + 5);
  GdnWeights dw;
  dw.out_proj = gpu->to_device(hw.out_proj);
  dw.conv_w = gpu->to_device(hw.conv_w);
  dw.A_log = gpu->to_device(hw.A_log);
  dw.dt_bias = gpu->to_device(hw.dt_bias);
  dw.norm_w = gpu->to_device(hw.norm_w);
  int total = 0;
  for (int T : calls) total += T;
  auto cs = cpu->new_state(cfg, total);
  auto gs = gpu->new_state(cfg, total);
  int step = 0;
  for (int T : calls) {
    ++step;
    auto mixed = test::randn(size_t(T * C), seed + 10 * step);
    auto z = test::randn(size_t(T * V), seed + 10 * step + 1);
    auto b = test::randn(size_t(T * Hv), seed + 10 * step + 2);
    auto a = test::randn(size_t(T * Hv), seed + 10 * step + 3);
    std::vector<float> ref(size_t(T * V)), ref_out(size_t(T * H));
    cpu->begin_forward();
    if (with_out_proj)
      cpu->gdn_core_linear(test::host_f32(ref_out, {T, H}), test::host_f32(ref, {T, V}), test::host_f32(mixed, {T, C}),
                           test::host_f32(z, {T, V}), test::host_f32(b, {T, Hv}), test::host_f32(a, {T, Hv}), hw, cfg,
                           *cs, 0);
    else
      cpu->gdn_core(test::host_f32(ref, {T, V}), test::host_f32(mixed, {T, C}), test::host_f32(z, {T, V}),
                    test::host_f32(b, {T, Hv}), test::host_f32(a, {T, Hv}), hw, cfg, *cs, 0);
    cpu->advance(*cs, T);
    gpu->begin_forward();
    Tensor dy = gpu->scratch(DType::F32, {T, V});
    Tensor dout = test::nan_filled(*gpu, T, H);
    if (with_out_proj)
      gpu->gdn_core_linear(dout, dy, test::upload_f32(*gpu, mixed, {T, C}), test::upload_f32(*gpu, z, {T, V}),
                           test::upload_f32(*gpu, b, {T, Hv}), test::upload_f32(*gpu, a, {T, Hv}), dw, cfg, *gs, 0);
    else
      gpu->gdn_core(dy, test::upload_f32(*gpu, mixed, {T, C}), test::upload_f32(*gpu, z, {T, V}),
                    test::upload_f32(*gpu, b, {T, Hv}), test::upload_f32(*gpu, a, {T, Hv}), dw, cfg, *gs, 0);
    gpu->advance(*gs, T);
    if (with_out_proj) ref = ref_out;
    auto got = test::download(*gpu, with_out_proj ? dout : dy);
    all.insert(all.end(), got.begin(), got.end());
    const double e = test::nmse(got.data(), ref.data(), got.size());
    EXPECT_LT(e, kNmse) << "step " << step << " T=" << T;
    if (step == static_cast<int>(calls.size()))
      std::printf("gdn%s Hk=%d Hv=%d after %d calls: output NMSE %.3e\n", with_out_proj ? " + out_proj" : "", Hk, Hv,
                  step, e);
  }
  auto rec = test::download(*gpu, gs->recurrent_state[0]);
  auto conv = test::download(*gpu, gs->conv_state[0]);
  const double er = test::nmse(rec.data(), cs->recurrent_state[0].ptr<float>(), rec.size());
  const double ec = test::nmse(conv.data(), cs->conv_state[0].ptr<float>(), conv.size());
  std::printf("gdn%s Hk=%d Hv=%d state NMSE %.3e conv state NMSE %.3e\n", with_out_proj ? " + out_proj" : "", Hk, Hv,
              er, ec);
  EXPECT_LT(er, kNmse);
  EXPECT_EQ(ec, 0.0);  // the conv state is a copy of inputs: exact
  all.insert(all.end(), rec.begin(), rec.end());
  all.insert(all.end(), conv.begin(), conv.end());
  return all;
}

TEST(CudaGdn, RealShapes) {
  FERN_REQUIRE_GPU();
  test::each_value("FERN_CUDA_GDN_LEAN", {"0", "1"}, [] { run(16, 32, 7); });
}

// The step kernel compiled for the real shape (FERN_CUDA_GDN_LEAN=1: Dk = Dv = 128, 4 taps, the state requested
// before the PDL wait fixed at compile time) against the generic one: the same loads and arithmetic, so every
// output and both states must be the same bits over the whole sequence. Here only the first call takes the lean
// kernel (the backend requests the state early only when the previous GDN call wrote another layer's state, as in
// the forward pass: CudaForward.LeanGdnKernelSameLogits covers every decode step); every later output depends on
// the state it left.
TEST(CudaGdn, LeanKernelSameBits) {
  FERN_REQUIRE_GPU();
  std::vector<float> got[2];
  for (int lean = 0; lean < 2; ++lean) {
    test::EnvGuard g("FERN_CUDA_GDN_LEAN", lean ? "1" : "0");
    got[lean] = run(16, 32, 21, true);
  }
  EXPECT_TRUE(test::same_bits(got[0], got[1]));
}

TEST(CudaGdn, FewHeads) {
  FERN_REQUIRE_GPU();
  run(2, 4, 11);
}

TEST(CudaGdn, WithOutProjRealShapes) {
  FERN_REQUIRE_GPU();
  test::each_value("FERN_CUDA_GDN_LEAN", {"0", "1"}, [] { run(16, 32, 7, true); });
}

TEST(CudaGdn, WithOutProjFewHeads) {
  FERN_REQUIRE_GPU();
  run(2, 4, 11, true);
}

// Prompt-sized calls through gdn_core_linear, whose out_proj then runs on the prefill GEMM: the gated norm computed
// straight into the GEMM's rows (FERN_CUDA_GATED_NORM_ROWS=fused, the default) and the norm then the conversion
// (separate) both against the CPU, and against each other bit for bit (outputs and states). 400 rows take the
// chunked delta rule, 40 and 17 the scan, 2 a GEMV for out_proj (the fused path's fallback: norm in place, linear).
TEST(CudaGdn, WithOutProjPrefillNormRows) {
  FERN_REQUIRE_GPU();
  std::vector<float> got[2];
  for (int fused = 0; fused < 2; ++fused) {
    test::EnvGuard g("FERN_CUDA_GATED_NORM_ROWS", fused ? "fused" : "separate");
    got[fused] = run(16, 32, 31, true, {1, 400, 1, 40, 17, 2, 1});
  }
  EXPECT_TRUE(test::same_bits(got[0], got[1]));
  test::EnvGuard bad("FERN_CUDA_GATED_NORM_ROWS", "both");
  EXPECT_THROW(run(16, 32, 31, true, {1, 40}), std::exception) << "an unknown value of the switch";
}

// The multi-row fallback of an unsupported prefill shape (one step launch per row, then the gated norm of all
// rows) forced for the real shape.
TEST(CudaGdn, RowsFallback) {
  FERN_REQUIRE_GPU();
  test::EnvGuard rows("FERN_GDN_PREFILL", "rows");
  run(16, 32, 13);
}

}  // namespace
}  // namespace fern
