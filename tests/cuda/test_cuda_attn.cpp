// CUDA gated attention core (q/k norm + partial RoPE + BF16 KV append, GQA split-K attention, sigmoid gate)
// against the CPU backend at the real shapes (16 query heads, 2 KV heads, head dim 256, 64 rotary dims,
// theta 1e7): a multi-row prefill then decode steps, at a short capacity (one split) and a long one (many splits).
#include <gtest/gtest.h>

#include <cstdlib>

#include "attn_test_util.h"

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

// The decode kernel with each head grouping (FERN_CUDA_ATTN_HG, read at every call): all 8 query heads of a KV
// head in one block (218 registers), 4 per block (the default for 8), 2 per block.
TEST(CudaAttn, DecodeHeadGroups) {
  FERN_REQUIRE_GPU();
  for (const char* hg : {"1", "2", "4"}) {
    SCOPED_TRACE(hg);
    test::EnvGuard g("FERN_CUDA_ATTN_HG", hg);
    std::printf("FERN_CUDA_ATTN_HG=%s\n", hg);
    run(16, 2, 256, 4096, {300, 1, 1, 1}, 21);
  }
}

TEST(CudaAttn, OtherHeadShapes) {
  FERN_REQUIRE_GPU();
  run(4, 2, 256, 300, {17, 1, 1}, 9);
  run(8, 2, 128, 500, {100, 1, 1}, 13);
}

}  // namespace
}  // namespace fern
