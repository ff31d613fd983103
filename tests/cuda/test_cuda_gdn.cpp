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

// The whole GDN mixer for one token (Backend::gdn_mixer: input norm, the four projections, the step, out_proj) with
// the projections and the step as one launch (FERN_CUDA_GDN_FUSE=1, cuda::gdn_proj_step) against the two launches
// (=0), output by output: the projections (mixed, z, b, a), the step's raw output y, the mixer's output and both
// states must be the same bits (the same loads, products and order in both), and the mixer's output must match
// the CPU's within kNmse (the projection's error, NMSE ~1e-12 at 4 bits, plus the core's). Two GDN layers of one
// weight set with their own states, called in turn for 6 decode steps: consecutive fused launches reuse the key
// heads' arrival counters, which the last step block of each head must have reset (a stale count lets a step
// block read rows before they are written: outputs off by NMSE ~1; a lost one hangs, so the GPU scripts run this
// under a timeout). The weights are grouped in one region as upload() leaves them (the fused form needs that).
std::vector<std::vector<float>> run_mixer(uint64_t seed, int steps, int64_t* fused) {
  constexpr int Hk = 16, Hv = 32, layers = 2;
  constexpr int64_t H = 2048;
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  ModelConfig cfg;
  cfg.num_hidden_layers = layers;
  cfg.layer_types = {LayerType::LinearAttention, LayerType::LinearAttention};
  cfg.linear_num_key_heads = Hk;
  cfg.linear_num_value_heads = Hv;
  cfg.hidden_size = H;
  const int64_t C = cfg.gdn_conv_dim(), V = cfg.gdn_value_dim();
  const float eps = 1e-6f;
  test::OwnedStorage st;
  auto vec = [&](int64_t n, float mean, float sd, uint64_t s) {
    Tensor t = st.make(DType::F32, {n});
    auto v = test::randn(size_t(n), s, sd);
    for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = mean + v[i];
    return t;
  };
  GdnWeights hw;
  hw.in_proj_qkv = test::raw_affine(st, "in_proj_qkv", 0, C, H, 4, 64, seed + 1);
  hw.in_proj_z = test::raw_affine(st, "in_proj_z", 0, V, H, 4, 64, seed + 2);
  hw.in_proj_b = test::raw_affine(st, "in_proj_b", 0, Hv, H, 4, 64, seed + 3);
  hw.in_proj_a = test::raw_affine(st, "in_proj_a", 0, Hv, H, 4, 64, seed + 4);
  hw.conv_w = vec(C * 4, 0.0f, 0.5f, seed + 5).reshape({C, 4});
  hw.A_log = vec(Hv, 0.5f, 0.8f, seed + 6);
  hw.dt_bias = vec(Hv, -1.0f, 0.5f, seed + 7);
  hw.norm_w = vec(128, 1.0f, 0.1f, seed + 8);
  hw.out_proj = test::raw_affine(st, "out_proj", 0, H, V, 4, 64, seed + 9);
  const Tensor in_norm = vec(H, 1.0f, 0.3f, seed + 10);  // around 1, as trained RMSNorm weights are
  std::vector<LinearWeight> proj = {gpu->to_device(hw.in_proj_qkv), gpu->to_device(hw.in_proj_z),
                                    gpu->to_device(hw.in_proj_b), gpu->to_device(hw.in_proj_a)};
  test::group_on_device(*gpu, proj);
  GdnWeights dw;
  dw.in_proj_qkv = proj[0];
  dw.in_proj_z = proj[1];
  dw.in_proj_b = proj[2];
  dw.in_proj_a = proj[3];
  dw.out_proj = gpu->to_device(hw.out_proj);
  dw.conv_w = gpu->to_device(hw.conv_w);
  dw.A_log = gpu->to_device(hw.A_log);
  dw.dt_bias = gpu->to_device(hw.dt_bias);
  dw.norm_w = gpu->to_device(hw.norm_w);
  const Tensor d_norm = gpu->to_device(in_norm);
  auto cs = cpu->new_state(cfg, steps);
  auto gs = gpu->new_state(cfg, steps);
  // Persistent device buffers (scratch would be reused between calls): the projections, y and the output.
  std::vector<Tensor> dbuf = {gpu->alloc(DType::F32, {1, C}), gpu->alloc(DType::F32, {1, V}),
                              gpu->alloc(DType::F32, {1, Hv}), gpu->alloc(DType::F32, {1, Hv}),
                              gpu->alloc(DType::F32, {1, V}), gpu->alloc(DType::F32, {1, H})};
  std::vector<std::vector<float>> all(dbuf.size() + 2);
  for (int s = 0; s < steps; ++s) {
    for (int layer = 0; layer < layers; ++layer) {
      const auto h = test::randn(size_t(H), seed + 100 * s + 11 * layer + 50);
      std::vector<float> xn(static_cast<size_t>(H)), mixed(static_cast<size_t>(C)), z(static_cast<size_t>(V)),
          b(static_cast<size_t>(Hv)), a(static_cast<size_t>(Hv)), y(static_cast<size_t>(V)), ref(static_cast<size_t>(H));
      auto hc = h;  // host_f32 takes a mutable vector
      cpu->begin_forward();
      cpu->gdn_mixer(test::host_f32(ref, {1, H}), test::host_f32(hc, {1, H}), in_norm, eps, test::host_f32(xn, {1, H}),
                     test::host_f32(mixed, {1, C}), test::host_f32(z, {1, V}), test::host_f32(b, {1, Hv}),
                     test::host_f32(a, {1, Hv}), test::host_f32(y, {1, V}), hw, cfg, *cs, layer);
      gpu->begin_forward();
      Tensor dxn = gpu->scratch(DType::F32, {1, H});
      gpu->gdn_mixer(dbuf[5], test::upload_f32(*gpu, h, {1, H}), d_norm, eps, dxn, dbuf[0], dbuf[1], dbuf[2], dbuf[3],
                     dbuf[4], dw, cfg, *gs, layer);
      for (size_t i = 0; i < dbuf.size(); ++i) {
        const auto got = test::download(*gpu, dbuf[i]);
        all[i].insert(all[i].end(), got.begin(), got.end());
      }
      const auto got = test::download(*gpu, dbuf[5]);
      const double e = test::nmse(got.data(), ref.data(), got.size());
      EXPECT_LT(e, kNmse) << "step " << s << " layer " << layer;
      if (s == steps - 1 && layer == layers - 1) std::printf("gdn mixer after %d steps: output NMSE %.3e\n", steps, e);
    }
    gpu->advance(*gs, 1);
    cpu->advance(*cs, 1);
  }
  for (int layer = 0; layer < layers; ++layer) {
    const auto rec = test::download(*gpu, gs->recurrent_state[layer]);
    const auto conv = test::download(*gpu, gs->conv_state[layer]);
    EXPECT_LT(test::nmse(rec.data(), cs->recurrent_state[layer].ptr<float>(), rec.size()), kNmse);
    EXPECT_EQ(test::nmse(conv.data(), cs->conv_state[layer].ptr<float>(), conv.size()), 0.0);  // copies of inputs
    all[dbuf.size()].insert(all[dbuf.size()].end(), rec.begin(), rec.end());
    all[dbuf.size() + 1].insert(all[dbuf.size() + 1].end(), conv.begin(), conv.end());
  }
  *fused = gpu->gdn_fused();
  return all;
}

// The fused forms (1: the step blocks request their state after their rows; 2: into shared memory at the start;
// both at 72 registers; 3: as 2 at 80) against the two launches (0).
TEST(CudaGdn, FusedProjectionsAndStepSameBits) {
  FERN_REQUIRE_GPU();
  constexpr int kSteps = 6;
  const char* names[] = {"mixed", "z", "b", "a", "y", "out", "recurrent state", "conv state"};
  const char* forms[] = {"0", "1", "2", "3"};
  std::vector<std::vector<float>> got[4];
  for (int fuse = 0; fuse < 4; ++fuse) {
    test::EnvGuard g("FERN_CUDA_GDN_FUSE", forms[fuse]);
    int64_t fused = -1;
    got[fuse] = run_mixer(41, kSteps, &fused);
    std::printf("FERN_CUDA_GDN_FUSE=%d: %lld fused mixers\n", fuse, static_cast<long long>(fused));
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    // Every call on a GPU that holds the fused grid at once (>= 64 SMs at three blocks per SM); none unfused.
    if (fuse == 0 || sms >= 64) {
      EXPECT_EQ(fused, fuse ? 2 * kSteps : 0);
    }
    if (fuse == 0) continue;
    for (size_t i = 0; i < got[0].size(); ++i)
      EXPECT_TRUE(test::same_bits(got[0][i], got[fuse][i])) << names[i] << ", form " << fuse;
  }
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
