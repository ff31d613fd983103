// CUDA gated attention core (q/k norm + partial RoPE + BF16 KV append, GQA split-K attention, sigmoid gate)
// against the CPU backend at the real shapes (16 query heads, 2 KV heads, head dim 256, 64 rotary dims,
// theta 1e7): a multi-row prefill then decode steps, at a short capacity (one split) and a long one (many splits).
// The decode attention kernels (FERN_CUDA_ATTN_DECODE: tc, the tensor-core kernel, and split, the CUDA-core one)
// each through the backend against the CPU, and directly on random BF16 caches of up to 70K positions against a
// double-precision reference on the host.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "attn_test_util.h"
#include "cuda/attn_decode_tc.h"
#include "cuda/fill.h"
#include "cuda/kernels.h"

namespace fern {
namespace {

// The GPU keeps K and V in BF16 (relative rounding 2^-9 per element), the CPU in F32: measured output NMSE
// 3e-6..7e-6 on the H200. Wrong positions, rotary pairs or heads give > 1e-2; 1e-4 separates them.
constexpr double kNmse = 1e-4;

void run(int Hq, int Hkv, int D, int64_t capacity, std::vector<int> calls, uint64_t seed) {
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  ModelConfig cfg;
  cfg.num_hidden_layers = 1;
  cfg.layer_types = {LayerType::FullAttention};
  cfg.num_attention_heads = Hq;
  cfg.num_key_value_heads = Hkv;
  cfg.head_dim = D;
  test::OwnedStorage st;
  AttnWeights hw;
  auto vec = [&](int64_t n, uint64_t s) {
    Tensor t = st.make(DType::F32, {n});
    auto v = test::randn(size_t(n), s, 0.1f);
    for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = 1.0f + v[i];
    return t;
  };
  hw.q_norm = vec(D, seed + 1);
  hw.k_norm = vec(D, seed + 2);
  AttnWeights dw;
  dw.q_norm = gpu->to_device(hw.q_norm);
  dw.k_norm = gpu->to_device(hw.k_norm);
  auto cs = cpu->new_state(cfg, capacity);
  auto gs = gpu->new_state(cfg, capacity);
  int call = 0;
  for (int T : calls) {
    ++call;
    const double e = test::attn_call_nmse(*cpu, *gpu, hw, dw, cfg, *cs, *gs, T, seed + 10 * call);
    std::printf("attn Hq=%d Hkv=%d D=%d cap=%ld call %d T=%d pos=%ld  NMSE %.3e\n", Hq, Hkv, D, long(capacity), call,
                T, long(cs->pos), e);
    EXPECT_LT(e, kNmse) << "call " << call;
  }
}

TEST(CudaAttn, ShortContextOneSplit) {
  FERN_REQUIRE_GPU();
  run(16, 2, 256, 64, {7, 1, 1, 1, 20, 1}, 3);
}

TEST(CudaAttn, LongContextSplitK) {
  FERN_REQUIRE_GPU();
  run(16, 2, 256, 4096, {1, 1500, 1, 1, 333, 1, 1}, 5);
}

// The split decode kernel with each head grouping (FERN_CUDA_ATTN_HG, read at every call): all 8 query heads of a
// KV head in one block (218 registers), 4 per block (the default for 8), 2 per block.
TEST(CudaAttn, DecodeHeadGroups) {
  FERN_REQUIRE_GPU();
  test::EnvGuard split("FERN_CUDA_ATTN_DECODE", "split");  // the grouping is the split kernel's
  for (const char* hg : {"1", "2", "4"}) {
    SCOPED_TRACE(hg);
    test::EnvGuard g("FERN_CUDA_ATTN_HG", hg);
    std::printf("FERN_CUDA_ATTN_HG=%s\n", hg);
    run(16, 2, 256, 4096, {300, 1, 1, 1}, 21);
  }
}

TEST(CudaAttn, OtherHeadShapes) {
  FERN_REQUIRE_GPU();
  for (const char* kernel : {"tc", "split"}) {
    SCOPED_TRACE(kernel);
    test::EnvGuard g("FERN_CUDA_ATTN_DECODE", kernel);
    std::printf("FERN_CUDA_ATTN_DECODE=%s\n", kernel);
    run(4, 2, 256, 300, {17, 1, 1}, 9);
    run(8, 2, 128, 500, {100, 1, 1}, 13);
    run(2, 2, 128, 100, {1, 1, 40, 1}, 17);  // one query head per KV head
  }
}

// Both decode kernels through the backend at the contexts 1, 7 and 300 (decode steps after prefills of 5 and 292
// rows), with one split (capacity 64) and with 64 splits of which most are empty at these lengths (capacity 4096).
TEST(CudaAttn, DecodeKernelsShortContexts) {
  FERN_REQUIRE_GPU();
  for (const char* kernel : {"tc", "split"}) {
    SCOPED_TRACE(kernel);
    test::EnvGuard g("FERN_CUDA_ATTN_DECODE", kernel);
    std::printf("FERN_CUDA_ATTN_DECODE=%s\n", kernel);
    run(16, 2, 256, 4096, {1, 5, 1, 292, 1, 1}, 31);
    run(16, 2, 256, 320, {1, 5, 1, 292, 1}, 37);
  }
}

// The tensor-core decode kernel with the prep inside it (the default) and as its own launch before it
// (FERN_CUDA_ATTN_PREP=separate), through the backend against the CPU: one split and many, the new row at the first
// and at the last slot of a tile (positions 64 and 127 after prefills), other head shapes (D = 128, one query head
// per KV head), and the queries of several heads per KV head normalised by different warps.
TEST(CudaAttn, DecodePrepFusedAndSeparate) {
  FERN_REQUIRE_GPU();
  test::EnvGuard k("FERN_CUDA_ATTN_DECODE", "tc");
  for (const char* prep : {"fused", "separate"}) {
    SCOPED_TRACE(prep);
    test::EnvGuard g("FERN_CUDA_ATTN_PREP", prep);
    std::printf("FERN_CUDA_ATTN_PREP=%s\n", prep);
    run(16, 2, 256, 64, {7, 1, 1, 1, 20, 1}, 51);
    run(16, 2, 256, 4096, {64, 1, 62, 1, 1, 1500, 1}, 53);
    run(8, 2, 128, 500, {100, 1, 1}, 55);
    run(2, 2, 128, 100, {1, 1, 40, 1}, 57);
  }
}

// GPU-free: the switch's values, and an unknown one is a user error that names the variable.
TEST(CudaAttn, DecodeKernelSwitch) {
  {
    test::EnvGuard g("FERN_CUDA_ATTN_DECODE", nullptr);
    EXPECT_EQ(cuda::attn_decode_kernel_choice(), cuda::AttnDecodeKernel::Tc);
  }
  {
    test::EnvGuard g("FERN_CUDA_ATTN_DECODE", "split");
    EXPECT_EQ(cuda::attn_decode_kernel_choice(), cuda::AttnDecodeKernel::Split);
  }
  {
    test::EnvGuard g("FERN_CUDA_ATTN_DECODE", "tc");
    EXPECT_EQ(cuda::attn_decode_kernel_choice(), cuda::AttnDecodeKernel::Tc);
  }
  test::EnvGuard g("FERN_CUDA_ATTN_DECODE", "tensor");
  try {
    cuda::attn_decode_kernel_choice();
    FAIL() << "no error for an unknown value";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERN_CUDA_ATTN_DECODE=tensor"), std::string::npos) << e.what();
  }
  {
    test::EnvGuard gp("FERN_CUDA_ATTN_PREP", nullptr);
    EXPECT_TRUE(cuda::attn_prep_fused());
    test::EnvGuard gs("FERN_CUDA_ATTN_PREP", "separate");
    EXPECT_FALSE(cuda::attn_prep_fused());
    test::EnvGuard gb("FERN_CUDA_ATTN_PREP", "both");
    try {
      cuda::attn_prep_fused();
      FAIL() << "no error for an unknown value";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FERN_CUDA_ATTN_PREP=both"), std::string::npos) << e.what();
    }
  }
  // The combine's switch is read before anything is launched.
  test::EnvGuard gc("FERN_CUDA_ATTN_COMBINE", "v3");
  try {
    cuda::attn_decode_combine(cuda::Ctx{}, cuda::AttnShape{16, 2, 256, 64, 1e7f, 1e-6f, 64}, 4, nullptr, nullptr,
                              nullptr, nullptr, 1);
    FAIL() << "no error for an unknown value";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERN_CUDA_ATTN_COMBINE=v3"), std::string::npos) << e.what();
  }
}

// The kernels alone on a random BF16 cache (values uniform in +-[0, 1)) of L positions, one query row, against a
// double-precision reference computed from the same BF16 values: only the kernels' own arithmetic differs.
// q uniform in +-qmax: qmax 1 gives scores of standard deviation ~0.33 (flat softmax), qmax 12 ~4 (peaked: over
// 70K keys the weight sits on a few dozen). Expected: fp32 accumulation plus, for tc, q and P kept to ~2^-17
// relative by the hi/lo bf16 split: NMSE ~1e-10. q or P rounded to bf16 once (2^-9) would give ~1e-5 at qmax 12,
// so 1e-7 separates the precise arithmetic from that.
constexpr double kKernelNmse = 1e-7;

struct KernelCase {
  int Hq, Hkv, D;
  int64_t L;
  float qmax;
};

// One random cache and query row of case k on the GPU, and the reference output computed from them on the host.
struct KernelData {
  Tensor kc, vc, q, qg, pos;
  std::vector<float> ref;
};

KernelData make_kernel_data(CudaBackend& gpu, const KernelCase& k, uint64_t seed) {
  KernelData d;
  const int64_t kv = k.L * k.Hkv * k.D;
  d.kc = gpu.alloc(DType::BF16, {kv});
  d.vc = gpu.alloc(DType::BF16, {kv});
  d.q = gpu.alloc(DType::F32, {int64_t(k.Hq) * k.D});
  d.qg = gpu.alloc(DType::F32, {int64_t(k.Hq) * 2 * k.D});
  d.pos = gpu.alloc(DType::I32, {1});
  cuda::fill_random_bf16(gpu.stream(), d.kc.ptr<uint16_t>(), kv, seed, 0.0f, 1.0f, true);
  cuda::fill_random_bf16(gpu.stream(), d.vc.ptr<uint16_t>(), kv, seed + 1, 0.0f, 1.0f, true);
  cuda::fill_random_f32(gpu.stream(), d.q.ptr<float>(), d.q.numel(), seed + 2, -k.qmax, k.qmax);
  cuda::fill_random_f32(gpu.stream(), d.qg.ptr<float>(), d.qg.numel(), seed + 3, -2.0f, 2.0f);
  const int32_t p = static_cast<int32_t>(k.L - 1);
  EXPECT_EQ(cudaMemcpy(d.pos.data, &p, 4, cudaMemcpyHostToDevice), cudaSuccess);
  gpu.synchronize();
  std::vector<uint16_t> hk(static_cast<size_t>(kv)), hv(static_cast<size_t>(kv));
  std::vector<float> hq(size_t(d.q.numel())), hqg(size_t(d.qg.numel()));
  EXPECT_EQ(cudaMemcpy(hk.data(), d.kc.data, size_t(kv) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(hv.data(), d.vc.data, size_t(kv) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(hq.data(), d.q.data, hq.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(hqg.data(), d.qg.data, hqg.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  d.ref.assign(hq.size(), 0.0f);
  const int G = k.Hq / k.Hkv;
  std::vector<double> s(static_cast<size_t>(k.L)), kf(static_cast<size_t>(kv)), vf(static_cast<size_t>(kv));
  for (int64_t i = 0; i < kv; ++i) {
    kf[size_t(i)] = bf16_to_f32(hk[size_t(i)]);
    vf[size_t(i)] = bf16_to_f32(hv[size_t(i)]);
  }
  for (int h = 0; h < k.Hq; ++h) {
    const int kvh = h / G;
    const float* qh = hq.data() + int64_t(h) * k.D;
    double mx = -INFINITY;
    for (int64_t j = 0; j < k.L; ++j) {
      const double* kr = kf.data() + (j * k.Hkv + kvh) * k.D;
      double dot = 0;
      for (int e = 0; e < k.D; ++e) dot += double(qh[e]) * kr[e];
      s[size_t(j)] = dot / std::sqrt(double(k.D));
      mx = std::max(mx, s[size_t(j)]);
    }
    std::vector<double> acc(size_t(k.D), 0.0);
    double den = 0;
    for (int64_t j = 0; j < k.L; ++j) {
      const double w = std::exp(s[size_t(j)] - mx);
      den += w;
      const double* vr = vf.data() + (j * k.Hkv + kvh) * k.D;
      for (int e = 0; e < k.D; ++e) acc[size_t(e)] += w * vr[e];
    }
    for (int e = 0; e < k.D; ++e) {
      const double gate = hqg[size_t(int64_t(h) * 2 * k.D + k.D + e)];
      d.ref[size_t(int64_t(h) * k.D + e)] = static_cast<float>(acc[size_t(e)] / den / (1.0 + std::exp(-gate)));
    }
  }
  return d;
}

// One decode kernel over the case's data with nsplit pieces (the output poisoned with NaN first); NMSE against ref.
double kernel_nmse(CudaBackend& gpu, const KernelCase& k, const KernelData& d, bool tc, int nsplit) {
  Tensor o = test::nan_filled(gpu, 1, int64_t(k.Hq) * k.D);
  Tensor pml = gpu.alloc(DType::F32, {int64_t(k.Hq) * nsplit * 2});
  Tensor pacc = gpu.alloc(DType::F32, {int64_t(k.Hq) * nsplit * k.D});
  cuda::Ctx c;
  c.stream = gpu.stream();
  c.sms = gpu.sm_count();
  c.pdl = gpu.pdl();
  const cuda::AttnShape sh{k.Hq, k.Hkv, k.D, 0, 1e7f, 1e-6f, k.L};
  (tc ? cuda::attn_decode_tc : cuda::attn_decode)(c, sh, d.pos.ptr<int32_t>(), d.q.ptr<float>(), d.qg.ptr<float>(),
                                                  d.kc.ptr<uint16_t>(), d.vc.ptr<uint16_t>(), pml.ptr<float>(),
                                                  pacc.ptr<float>(), o.ptr<float>(), 1, nsplit);
  gpu.synchronize();
  auto got = test::download(gpu, o);
  return test::nmse(got.data(), d.ref.data(), got.size());
}

TEST(CudaAttn, DecodeKernelsLongContexts) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  const KernelCase cases[] = {{16, 2, 256, 1, 12.0f},    {16, 2, 256, 7, 12.0f},     {16, 2, 256, 300, 1.0f},
                              {16, 2, 256, 4101, 1.0f},  {16, 2, 256, 4101, 12.0f},  {16, 2, 256, 70001, 1.0f},
                              {16, 2, 256, 70001, 12.0f}, {8, 2, 128, 4101, 12.0f},  {4, 4, 128, 1000, 12.0f}};
  uint64_t seed = 100;
  for (const KernelCase& k : cases) {
    const KernelData d = make_kernel_data(*gpu, k, seed += 10);
    // The state's default split count for this length, and awkward ones (a prime; more splits than 64-key tiles;
    // 200: more than one batch of splits per thread in the combine), with both combines (FERN_CUDA_ATTN_COMBINE).
    for (int nsplit : {cuda::attn_splits(k.L), 7, 128, 200}) {
      for (const char* comb : {"v2", "v1"}) {
        test::EnvGuard gc("FERN_CUDA_ATTN_COMBINE", comb);
        for (bool tc : {true, false}) {
          const double e = kernel_nmse(*gpu, k, d, tc, nsplit);
          std::printf("attn decode kernel %-5s combine %s Hq=%d Hkv=%d D=%d L=%ld qmax=%g nsplit=%d  NMSE %.3e\n",
                      tc ? "tc" : "split", comb, k.Hq, k.Hkv, k.D, long(k.L), double(k.qmax), nsplit, e);
          EXPECT_LT(e, kKernelNmse) << (tc ? "tc" : "split") << " combine " << comb << " L=" << k.L
                                    << " nsplit=" << nsplit;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fern
