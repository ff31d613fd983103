// CUDA Gated DeltaNet prefill (gdn_prefill.cu, gdn_chunked.cu through the backend's gdn_core at T > 1) against the
// CPU backend, for both forms of the delta rule (the register-resident scan and the chunked WY form, chosen with
// FERN_GDN_PREFILL): the real shapes from a zero state, sequences of calls carrying non-zero recurrent and conv
// states (prefill chunks, then decode rows), awkward head shapes (Dk != Dv, Hv == Hk, small heads, other conv
// kernels, a shape only the per-row fallback takes), the same rows in one call or in several, every scan variant,
// the chunked form run directly at T = 1 and at chunk boundaries, and the switch's error on an unknown value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "cuda/backend_internal.h"
#include "cuda/gdn_prefill.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

// Outputs and recurrent state against the CPU backend (chunked form, fp32). The GPU scan is the recurrent form in
// fp32 with another summation order, so the two differ by rounding only. Measured on the H200 (two runs, every scan
// variant): outputs 3.4e-14 .. 2.9e-13 and states 1.3e-14 .. 4.9e-13 (the largest: slow decay, 2048 rows or 8
// calls, Dk 64); one call vs five 7e-15 / 1e-14. The threshold leaves 200x above the largest; a wrong gate, head
// mapping, conv tap or norm gives > 1e-3.
constexpr double kNmse = 1e-10;

// The chunked form against the CPU backend (its chunked form in fp32, in another order: products on the tensor
// cores as 3xTF32, ~2^-21 relative per product instead of fp32's 2^-24, and a forward substitution in fp32).
// Measured on the H200 (commit 1790705): outputs 4.3e-14 .. 2.4e-13, states 1.9e-14 .. 2.6e-13 (the largest: slow
// decay, 2048 rows or chains of calls), one call vs five (GPU vs GPU, other chunk boundaries) 3.7e-14 / 6.3e-14:
// the same level as the scan, so the same threshold, ~400x above the largest. A wrong mask, decay, fragment layout
// or chunk carry gives > 1e-4.
constexpr double kNmseChunked = 1e-10;

struct Shape {
  int Hk, Hv, Dk, Dv, kernel;
};

// One layer's weights and the inputs of a sequence of calls, run on the CPU and the GPU side by side.
class GdnPair {
 public:
  GdnPair(const Shape& s, bool mild_decay, uint64_t seed) : seed_(seed), gpu_(test::make_gpu()), cpu_(make_cpu_backend()) {
    cfg_.num_hidden_layers = 1;
    cfg_.layer_types = {LayerType::LinearAttention};
    cfg_.linear_num_key_heads = s.Hk;
    cfg_.linear_num_value_heads = s.Hv;
    cfg_.linear_key_head_dim = s.Dk;
    cfg_.linear_value_head_dim = s.Dv;
    cfg_.linear_conv_kernel_dim = s.kernel;
    const int64_t C = cfg_.gdn_conv_dim();
    auto vec = [&](int64_t n, float mean, float sd, uint64_t sd_seed) {
      Tensor t = st_.make(DType::F32, {n});
      auto v = test::randn(size_t(n), sd_seed, sd);
      for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = mean + v[i];
      return t;
    };
    hw_.conv_w = vec(C * s.kernel, 0.0f, 0.5f, seed + 1).reshape({C, s.kernel});
    // Mild: exp(A_log) ~ 0.02, decays ~0.99 per row, so the state remembers hundreds of rows and rounding errors
    // accumulate over the whole call; otherwise decays ~0.5 (the decode test's choice).
    hw_.A_log = vec(s.Hv, mild_decay ? -4.0f : 0.5f, mild_decay ? 0.5f : 0.8f, seed + 2);
    hw_.dt_bias = vec(s.Hv, -1.0f, 0.5f, seed + 3);
    hw_.norm_w = vec(s.Dv, 1.0f, 0.1f, seed + 4);
    dw_.conv_w = gpu_->to_device(hw_.conv_w);
    dw_.A_log = gpu_->to_device(hw_.A_log);
    dw_.dt_bias = gpu_->to_device(hw_.dt_bias);
    dw_.norm_w = gpu_->to_device(hw_.norm_w);
    cs_ = cpu_->new_state(cfg_, 1 << 16);
    gs_ = gpu_->new_state(cfg_, 1 << 16);
  }

  const ModelConfig& cfg() const { return cfg_; }
  CudaBackend& gpu() { return *gpu_; }
  const GdnWeights& device_weights() const { return dw_; }

  // The inputs of call number `call` with T rows; b and a include extreme rows (beta 0 or 1, no decay at all, a
  // decay that wipes the state).
  struct Inputs {
    std::vector<float> mixed, z, b, a;
  };
  Inputs inputs(int call, int T) const {
    const int64_t C = cfg_.gdn_conv_dim(), V = cfg_.gdn_value_dim(), Hv = cfg_.linear_num_value_heads;
    const uint64_t s = seed_ + 100 * uint64_t(call);
    Inputs in{test::randn(size_t(T * C), s), test::randn(size_t(T * V), s + 1), test::randn(size_t(T * Hv), s + 2),
              test::randn(size_t(T * Hv), s + 3)};
    for (int64_t i = 0; i < T * Hv; ++i) {
      if (i % 37 == 5) in.b[size_t(i)] = 30.0f;    // beta = 1
      if (i % 41 == 7) in.b[size_t(i)] = -30.0f;   // beta ~ 1e-13
      if (i % 43 == 11) in.a[size_t(i)] = -40.0f;  // softplus ~ 4e-18: no decay
      if (i % 53 == 13) in.a[size_t(i)] = 25.0f;   // g = -25 exp(A_log): (nearly) wipes the state
    }
    return in;
  }

  // Runs call `call` of T rows on the CPU backend; returns its output.
  std::vector<float> cpu_step(int call, int T) {
    Inputs h = inputs(call, T);
    const int64_t C = cfg_.gdn_conv_dim(), V = cfg_.gdn_value_dim(), Hv = cfg_.linear_num_value_heads;
    std::vector<float> ref(size_t(T * V));
    cpu_->begin_forward();
    cpu_->gdn_core(test::host_f32(ref, {T, V}), test::host_f32(h.mixed, {T, C}), test::host_f32(h.z, {T, V}),
                   test::host_f32(h.b, {T, Hv}), test::host_f32(h.a, {T, Hv}), hw_, cfg_, *cs_, 0);
    cpu_->advance(*cs_, T);
    return ref;
  }

  // Runs call `call` of T rows on both backends; returns the output NMSE.
  double step(int call, int T) {
    const std::vector<float> ref = cpu_step(call, T);
    const std::vector<float> got = run_gpu(*gs_, inputs(call, T), T);
    return test::nmse(got.data(), ref.data(), got.size());
  }

  // The GPU side alone on a given state (for one-call vs several-calls comparisons).
  std::vector<float> run_gpu(SequenceState& st, const Inputs& in, int T) {
    const int64_t C = cfg_.gdn_conv_dim(), V = cfg_.gdn_value_dim(), Hv = cfg_.linear_num_value_heads;
    gpu_->begin_forward();
    Tensor dy = gpu_->scratch(DType::F32, {T, V});
    gpu_->gdn_core(dy, test::upload_f32(*gpu_, in.mixed, {T, C}), test::upload_f32(*gpu_, in.z, {T, V}),
                   test::upload_f32(*gpu_, in.b, {T, Hv}), test::upload_f32(*gpu_, in.a, {T, Hv}), dw_, cfg_, st, 0);
    gpu_->advance(st, T);
    return test::download(*gpu_, dy);
  }

  // Recurrent state of a GPU sequence (by default the one step() runs) against the CPU's.
  double state_nmse(SequenceState* gpu_state = nullptr) {
    auto rec = test::download(*gpu_, (gpu_state ? gpu_state : gs_.get())->recurrent_state[0]);
    return test::nmse(rec.data(), cs_->recurrent_state[0].ptr<float>(), rec.size());
  }
  // Largest |difference| of the conv states: a copy of inputs, so exactly 0.
  double conv_diff() {
    auto conv = test::download(*gpu_, gs_->conv_state[0]);
    return test::max_abs_diff(conv.data(), cs_->conv_state[0].ptr<float>(), conv.size());
  }

 private:
  uint64_t seed_;
  ModelConfig cfg_;
  test::OwnedStorage st_;
  GdnWeights hw_, dw_;
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<SequenceState> cs_, gs_;
};

// Runs the calls in order on one state, checking every output, then the final recurrent and conv states.
void run_calls(const Shape& s, bool mild, std::initializer_list<int> Ts, uint64_t seed, bool expect_kernels = true,
               double limit = kNmse) {
  GdnPair p(s, mild, seed);
  EXPECT_EQ(cuda::gdn_prefill_ok(cuda_backend_detail::gdn_shape(p.cfg())), expect_kernels);
  double worst = 0.0;
  int call = 0;
  for (int T : Ts) {
    const double e = p.step(call++, T);
    EXPECT_LT(e, limit) << "call " << call << " T=" << T;
    worst = std::max(worst, e);
  }
  const double es = p.state_nmse(), ec = p.conv_diff();
  const char* form = std::getenv("FERN_GDN_PREFILL");
  std::printf("gdn prefill [%s] Hk=%d Hv=%d Dk=%d Dv=%d kernel=%d %s, %d calls: worst output NMSE %.3e, state NMSE "
              "%.3e, conv state max diff %.3g\n",
              form ? form : "auto", s.Hk, s.Hv, s.Dk, s.Dv, s.kernel, mild ? "mild decay" : "fast decay", call, worst,
              es, ec);
  EXPECT_LT(es, limit);
  EXPECT_EQ(ec, 0.0);
}

constexpr Shape kReal{16, 32, 128, 128, 4};

// Each backend test runs once per form of the delta rule (FERN_GDN_PREFILL=scan, then chunked); "auto" picks one of
// the two per T, so both forms cover every case.
struct FormCase {
  const char* env;
  double limit;
};
constexpr FormCase kForms[] = {{"scan", kNmse}, {"chunked", kNmseChunked}};

TEST(CudaGdnPrefill, RealShapesFromZeroState) {
  FERN_REQUIRE_GPU();
  for (const FormCase& f : kForms) {
    test::EnvGuard env("FERN_GDN_PREFILL", f.env);
    // 63, 64, 65: one row short of a chunk, one chunk, one row into a padded second chunk.
    for (int T : {2, 17, 63, 64, 65, 200, 300, 2048}) run_calls(kReal, T >= 200, {T}, 1000 + uint64_t(T), true, f.limit);
  }
}

TEST(CudaGdnPrefill, RealShapesCarriedState) {
  FERN_REQUIRE_GPU();
  for (const FormCase& f : kForms) {
    test::EnvGuard env("FERN_GDN_PREFILL", f.env);
    // Prefill chunks (including T = 2 < kernel - 1, where the new conv state keeps old entries), decode rows between.
    run_calls(kReal, true, {300, 17, 1, 2, 64, 1, 1, 129}, 21, true, f.limit);
    run_calls(kReal, false, {33, 2, 1, 65}, 22, true, f.limit);
    // A chain of whole and partial chunks (2048 = 32 chunks, then 128 = 2, 65, 63) with slow decay: the state
    // carries over ~2,300 rows.
    run_calls(kReal, true, {2048, 128, 65, 63}, 23, true, f.limit);
  }
}

TEST(CudaGdnPrefill, AwkwardShapes) {
  FERN_REQUIRE_GPU();
  for (const FormCase& f : kForms) {
    test::EnvGuard env("FERN_GDN_PREFILL", f.env);
    run_calls({4, 8, 64, 128, 4}, true, {17, 2, 300, 1, 31}, 31, true, f.limit);  // Dk < Dv
    run_calls({4, 8, 128, 64, 4}, true, {17, 2, 300, 1, 31}, 32, true, f.limit);  // Dk > Dv
    run_calls({4, 4, 128, 128, 4}, false, {64, 3, 129}, 33, true, f.limit);       // Hv == Hk
    run_calls({2, 4, 16, 32, 4}, true, {2, 17, 500, 5}, 34, true, f.limit);       // small heads (chunked: scan)
    run_calls({3, 12, 32, 96, 2}, true, {5, 1, 70, 3}, 35, true, f.limit);        // conv kernel 2, 4 v-heads per k-head
    run_calls({2, 4, 64, 256, 7}, false, {3, 2, 40, 1, 19}, 36, true, f.limit);   // kernel 7 (T < 6), Dv 256
    run_calls({2, 4, 48, 64, 4}, true, {17, 2, 40}, 37, false, f.limit);          // Dk 48: the per-row fallback
  }
}

TEST(CudaGdnPrefill, UnknownFormIsAnError) {
  FERN_REQUIRE_GPU();
  GdnPair p(kReal, false, 61);
  test::EnvGuard env("FERN_GDN_PREFILL", "wy");
  const GdnPair::Inputs in = p.inputs(0, 8);
  auto st = p.gpu().new_state(p.cfg(), 64);
  try {
    p.run_gpu(*st, in, 8);
    FAIL() << "no error for FERN_GDN_PREFILL=wy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERN_GDN_PREFILL"), std::string::npos) << e.what();
  }
}

// The same rows in one call, or split over several calls, give the same outputs and state on the GPU (for the scan
// the split only changes where it reloads its registers and restarts its S . k look-ahead; for the chunked form it
// moves the chunk boundaries, so the two differ by the form's rounding: same threshold as against the CPU).
void one_call_equals_several(const FormCase& f) {
  test::EnvGuard env("FERN_GDN_PREFILL", f.env);
  GdnPair p(kReal, true, 41);
  const int64_t C = p.cfg().gdn_conv_dim(), V = p.cfg().gdn_value_dim(), Hv = p.cfg().linear_num_value_heads;
  const int T = 300;
  const GdnPair::Inputs all = p.inputs(0, T);
  auto one_state = p.gpu().new_state(p.cfg(), 1024);
  const std::vector<float> one = p.run_gpu(*one_state, all, T);
  auto split_state = p.gpu().new_state(p.cfg(), 1024);
  std::vector<float> split;
  int t0 = 0;
  for (int n : {100, 1, 2, 16, 181}) {
    GdnPair::Inputs part;
    part.mixed.assign(all.mixed.begin() + t0 * C, all.mixed.begin() + (t0 + n) * C);
    part.z.assign(all.z.begin() + t0 * V, all.z.begin() + (t0 + n) * V);
    part.b.assign(all.b.begin() + t0 * Hv, all.b.begin() + (t0 + n) * Hv);
    part.a.assign(all.a.begin() + t0 * Hv, all.a.begin() + (t0 + n) * Hv);
    const std::vector<float> o = p.run_gpu(*split_state, part, n);
    split.insert(split.end(), o.begin(), o.end());
    t0 += n;
  }
  ASSERT_EQ(t0, T);
  const double eo = test::nmse(split.data(), one.data(), one.size());
  auto s1 = test::download(p.gpu(), one_state->recurrent_state[0]);
  auto s2 = test::download(p.gpu(), split_state->recurrent_state[0]);
  const double es = test::nmse(s2.data(), s1.data(), s1.size());
  auto c1 = test::download(p.gpu(), one_state->conv_state[0]);
  auto c2 = test::download(p.gpu(), split_state->conv_state[0]);
  std::printf("gdn prefill [%s] one call vs 5 calls: output NMSE %.3e, state NMSE %.3e\n", f.env, eo, es);
  EXPECT_LT(eo, f.limit);
  EXPECT_LT(es, f.limit);
  EXPECT_EQ(test::max_abs_diff(c2.data(), c1.data(), c1.size()), 0.0);
}

TEST(CudaGdnPrefill, OneCallEqualsSeveral) {
  FERN_REQUIRE_GPU();
  for (const FormCase& f : kForms) one_call_equals_several(f);
}

// Every scan variant (cuda::gdn_prefill_scan run directly, not only the one the backend picks) against the CPU
// backend, over two calls carrying the state, at the real shape and two awkward ones.
void check_scan_variants(const Shape& shape, uint64_t seed) {
  GdnPair p(shape, true, seed);
  CudaBackend& be = p.gpu();
  const ModelConfig& cfg = p.cfg();
  const cuda::GdnShape sh = cuda_backend_detail::gdn_shape(cfg);
  const GdnWeights& dw = p.device_weights();
  const int64_t C = cfg.gdn_conv_dim(), V = cfg.gdn_value_dim(), Hv = cfg.linear_num_value_heads;
  cuda::Ctx c;
  c.stream = be.stream();
  c.sms = be.sm_count();
  struct Run {
    cuda::GdnScan v;
    const char* name;
    std::unique_ptr<SequenceState> st;
    double worst = 0.0;
  };
  std::vector<Run> runs;
  for (auto [v, name] : {std::pair{cuda::GdnScan::Slices4, "4 slices"}, std::pair{cuda::GdnScan::Slices8, "8 slices"},
                         std::pair{cuda::GdnScan::Slices8Cols2, "8 slices x 2 columns"}})
    if (cuda::gdn_scan_ok(sh, v)) runs.push_back({v, name, be.new_state(cfg, 1024)});
  ASSERT_FALSE(runs.empty());
  int call = 0;
  for (int T : {300, 64}) {
    const GdnPair::Inputs in = p.inputs(call, T);
    const std::vector<float> ref = p.cpu_step(call++, T);
    Tensor mixed = test::upload_f32(be, in.mixed, {T, C}), z = test::upload_f32(be, in.z, {T, V});
    Tensor b = test::upload_f32(be, in.b, {T, Hv}), a = test::upload_f32(be, in.a, {T, Hv});
    Tensor y = be.alloc(DType::F32, {T, V});
    Tensor xc = be.alloc(DType::F32, {cuda::gdn_prefill_scratch_floats(sh, T)});
    for (Run& run : runs) {
      auto& st = dynamic_cast<CudaState&>(*run.st);
      float* conv = st.conv_state[0].ptr<float>();
      float* rec = st.recurrent_state[0].ptr<float>();
      cuda::gdn_prefill_conv(c, sh, T, mixed.ptr<float>(), dw.conv_w.ptr<float>(), conv, xc.ptr<float>());
      cuda::gdn_prefill_scan(c, sh, T, xc.ptr<float>(), b.ptr<float>(), a.ptr<float>(), dw.A_log.ptr<float>(),
                             dw.dt_bias.ptr<float>(), rec, y.ptr<float>(), run.v);
      cuda::gdn_prefill_norm(c, sh, T, z.ptr<float>(), dw.norm_w.ptr<float>(), y.ptr<float>());
      const std::vector<float> o = test::download(be, y);
      const double e = test::nmse(o.data(), ref.data(), ref.size());
      EXPECT_LT(e, kNmse) << run.name << " T=" << T;
      run.worst = std::max(run.worst, e);
    }
  }
  for (Run& run : runs) {
    const double es = p.state_nmse(run.st.get());
    std::printf("gdn prefill scan %s, Dk=%d Dv=%d, 2 calls: worst output NMSE %.3e, state NMSE %.3e\n", run.name,
                shape.Dk, shape.Dv, run.worst, es);
    EXPECT_LT(es, kNmse) << run.name;
  }
}

// The chunked form run directly (cuda::gdn_prefill with GdnForm::Chunked: every T, including T = 1, which the
// backend sends to the decode kernel) against the CPU backend, over a chain of calls carrying the state.
void check_chunked_direct(const Shape& shape, bool mild, std::initializer_list<int> Ts, uint64_t seed) {
  GdnPair p(shape, mild, seed);
  CudaBackend& be = p.gpu();
  const ModelConfig& cfg = p.cfg();
  const cuda::GdnShape sh = cuda_backend_detail::gdn_shape(cfg);
  ASSERT_TRUE(cuda::gdn_chunked_ok(sh));
  const GdnWeights& dw = p.device_weights();
  const int64_t C = cfg.gdn_conv_dim(), V = cfg.gdn_value_dim(), Hv = cfg.linear_num_value_heads;
  cuda::Ctx c;
  c.stream = be.stream();
  c.sms = be.sm_count();
  auto st = be.new_state(cfg, 1 << 16);
  auto& cst = dynamic_cast<CudaState&>(*st);
  double worst = 0.0;
  int call = 0;
  for (int T : Ts) {
    const GdnPair::Inputs in = p.inputs(call, T);
    const std::vector<float> ref = p.cpu_step(call++, T);
    Tensor mixed = test::upload_f32(be, in.mixed, {T, C}), z = test::upload_f32(be, in.z, {T, V});
    Tensor b = test::upload_f32(be, in.b, {T, Hv}), a = test::upload_f32(be, in.a, {T, Hv});
    Tensor y = be.alloc(DType::F32, {T, V});
    Tensor xc = be.alloc(DType::F32, {cuda::gdn_prefill_scratch_floats(sh, T, cuda::GdnForm::Chunked)});
    cuda::gdn_prefill(c, sh, T, mixed.ptr<float>(), z.ptr<float>(), b.ptr<float>(), a.ptr<float>(),
                      dw.conv_w.ptr<float>(), dw.A_log.ptr<float>(), dw.dt_bias.ptr<float>(), dw.norm_w.ptr<float>(),
                      cst.conv_state[0].ptr<float>(), cst.recurrent_state[0].ptr<float>(), y.ptr<float>(),
                      xc.ptr<float>(), cuda::GdnForm::Chunked);
    const std::vector<float> o = test::download(be, y);
    const double e = test::nmse(o.data(), ref.data(), ref.size());
    EXPECT_LT(e, kNmseChunked) << "call " << call << " T=" << T;
    worst = std::max(worst, e);
  }
  const double es = p.state_nmse(st.get());
  std::printf("gdn chunked direct Dk=%d Dv=%d %s, %d calls: worst output NMSE %.3e, state NMSE %.3e\n", shape.Dk,
              shape.Dv, mild ? "mild decay" : "fast decay", call, worst, es);
  EXPECT_LT(es, kNmseChunked);
}

TEST(CudaGdnPrefill, ChunkedDirect) {
  FERN_REQUIRE_GPU();
  check_chunked_direct(kReal, true, {1, 63, 1, 64, 65, 1, 200}, 71);
  check_chunked_direct(kReal, false, {1, 2, 64, 129}, 72);
  check_chunked_direct({3, 12, 32, 96, 2}, true, {1, 65, 130}, 73);
}

TEST(CudaGdnPrefill, ScanVariants) {
  FERN_REQUIRE_GPU();
  check_scan_variants(kReal, 51);
  check_scan_variants({4, 8, 64, 128, 4}, 52);
  check_scan_variants({3, 12, 32, 96, 2}, 53);
}

}  // namespace
}  // namespace fern
