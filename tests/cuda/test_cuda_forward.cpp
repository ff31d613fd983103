// The whole forward pass on the CUDA backend against the CPU backend: a random 8-layer model (4-bit, real head
// dims) teacher-forced over 192 positions and then decoded step by step; the `small` synthetic checkpoint with
// peaked logits (the acceptance check: top-1 agreement >= 99%, logits NMSE <= 1e-3); and one decode step
// captured as a CUDA graph and replayed, which must produce the same greedy tokens as eager steps; the engine's
// decode through recorded steps (what fern serve runs) against its eager decode, and its tokens picked on the device
// against the host's picks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "cuda/gemm_wg.h"
#include "cuda/kernels.h"
#include "cuda/qweight.h"
#include "cuda/random_weights.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/forward.h"
#include "model/synth.h"
#include "ops/token_pick.h"

namespace fern {
namespace {

using Compare = test::LogitAgreement;

// upload() and the random device model put a layer's quantized mixer input projections in one region
// (weight_group.h), which the decode GEMV reads as one matrix.
void expect_grouped_projections(const ModelWeights& w) {
  for (const LayerWeights& L : w.layers) {
    std::vector<const LinearWeight*> in;
    if (L.type == LayerType::LinearAttention)
      in = {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a};
    else
      in = {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj};
    if (!in[0]->quantized()) continue;
    std::vector<cuda::QW> q;
    for (const LinearWeight* p : in) q.push_back(cuda::make_qw(*p));
    EXPECT_TRUE(cuda::linear_multi_contiguous(q.data(), static_cast<int>(q.size()))) << in[0]->name;
  }
}

// Teacher-forced prefill of `n` tokens (all logits) on both backends, then `steps` decode steps that feed both
// sides the CPU's greedy token. Returns the prefill comparison and the decode comparison; the GPU's decode logits
// go to gpu_steps where given.
// folds: the MoE routers the GPU ran inside the mixers' output projections (CudaBackend::moe_folds).
std::pair<Compare, Compare> run_model(const std::shared_ptr<ModelWeights>& hw, int n, int steps, uint64_t seed,
                                      std::vector<float>* gpu_steps = nullptr, int64_t* folds = nullptr) {
  const ModelConfig& cfg = hw->config;
  const int64_t V = cfg.vocab_size;
  auto cpu = make_cpu_backend();
  auto gpu = test::make_gpu();
  auto dw = gpu->upload(hw);
  expect_grouped_projections(*dw);
  auto cs = cpu->new_state(cfg, n + steps + 1);
  auto gs = gpu->new_state(cfg, n + steps + 1);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = int32_t(rng() % uint64_t(V));
  ForwardOptions all;
  all.all_logits = true;
  std::vector<float> ref(size_t(n * V));
  cpu->begin_forward();
  forward(*cpu, *hw, *cs, Tensor(ids.data(), DType::I32, {n}), test::host_f32(ref, {n, V}), all);
  gpu->begin_forward();
  Tensor did = gpu->scratch(DType::I32, {n});
  gpu->copy(did, Tensor(ids.data(), DType::I32, {n}));
  Tensor dl = gpu->scratch(DType::F32, {n, V});
  forward(*gpu, *dw, *gs, did, dl, all);
  auto got = test::download(*gpu, dl);
  const Compare pre = test::logit_agreement(got, ref, V);

  std::vector<float> ref_steps, got_steps;
  int32_t tok = int32_t(std::max_element(ref.end() - V, ref.end()) - (ref.end() - V));
  std::vector<float> one(static_cast<size_t>(V), 0.0f);
  for (int s = 0; s < steps; ++s) {
    cpu->begin_forward();
    forward(*cpu, *hw, *cs, Tensor(&tok, DType::I32, {1}), test::host_f32(one, {1, V}));
    ref_steps.insert(ref_steps.end(), one.begin(), one.end());
    gpu->begin_forward();
    Tensor d1 = gpu->scratch(DType::I32, {1});
    gpu->copy(d1, Tensor(&tok, DType::I32, {1}));
    Tensor dl1 = gpu->scratch(DType::F32, {1, V});
    forward(*gpu, *dw, *gs, d1, dl1);
    auto g1 = test::download(*gpu, dl1);
    got_steps.insert(got_steps.end(), g1.begin(), g1.end());
    tok = int32_t(std::max_element(one.begin(), one.end()) - one.begin());
  }
  const Compare dec = test::logit_agreement(got_steps, ref_steps, V);
  if (gpu_steps != nullptr) *gpu_steps = got_steps;
  if (folds != nullptr) *folds = gpu->moe_folds();
  return {pre, dec};
}

TEST(CudaForward, RandomDeviceModelGroupsProjections) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  expect_grouped_projections(*cuda::random_device_weights(*gpu, test::tiny_test_config(4), 5));
}

// A random 4-bit model of `layers` layers (real head dims) for the tests below.
std::shared_ptr<ModelWeights> random_model(uint64_t seed, int layers = 8) {
  test::RandomWeightsOptions o;
  o.seed = seed;
  o.quantized = true;
  return test::random_weights(test::tiny_test_config(layers), o);
}

TEST(CudaForward, RandomModelMatchesCpu) {
  FERN_REQUIRE_GPU();
  auto [pre, dec] = run_model(random_model(3), 192, 32, 21);
  std::printf("random 8-layer model: prefill 192 NMSE %.3e top-1 %.4f | decode 32 NMSE %.3e top-1 %.4f\n", pre.nmse,
              pre.top1, dec.nmse, dec.top1);
  std::printf("  prefill rows: worst %lld NMSE %.3e, median %.3e\n", static_cast<long long>(pre.worst_row),
              pre.worst_row_nmse, pre.median_row_nmse);
  // fp32 on both sides except the BF16 KV cache on the GPU: measured NMSE 9e-6 (prefill), 6e-8 (decode), top-1
  // agreement 1.0 on the H200. 1e-4 flags a broken layer
  // (those give > 1e-2). Top-1 may differ only where two logits are within rounding of each other.
  EXPECT_TRUE(pre.finite && dec.finite);
  EXPECT_LT(pre.nmse, 1e-4);
  EXPECT_LT(dec.nmse, 1e-4);
  EXPECT_GE(pre.top1, 0.97);
  EXPECT_GE(dec.top1, 0.97);
}

// The GDN step kernel compiled for the real head shape (FERN_CUDA_GDN_LEAN=1) against the generic one through the
// whole model: every decode step of the random 8-layer model (real head dims; each GDN call follows another layer's,
// so every one takes the kernel that requests the state before the PDL wait) must give the same logits, bit for bit.
TEST(CudaForward, LeanGdnKernelSameLogits) {
  FERN_REQUIRE_GPU();
  const auto hw = random_model(4);
  std::vector<float> steps[2];
  for (int lean = 0; lean < 2; ++lean) {
    test::EnvGuard g("FERN_CUDA_GDN_LEAN", lean ? "1" : "0");
    const auto [pre, dec] = run_model(hw, 16, 8, 23, &steps[lean]);
    EXPECT_LT(dec.nmse, 1e-4);  // RandomModelMatchesCpu's bound
  }
  EXPECT_TRUE(test::same_bits(steps[0], steps[1]));
}

// The MoE's router in the mixers' output projections (FERN_CUDA_MOE_FOLD=1, the default; kernels.h RouteFold)
// through the whole forward pass: a 4-layer model at the real widths (hidden 2,048, the real GDN and attention
// heads, experts of 512; 32 of them to keep it small), whose decode steps take the fold, against the CPU backend
// with RandomModelMatchesCpu's bounds under both settings, and the two settings' decode logits against each other:
// the router's logits differ only in summation order (~1e-7 relative), so the same experts are chosen and the
// logits agree to rounding (measured NMSE ...; a wrong expert or weight in any layer gives > 1e-4).
TEST(CudaForward, MoeRouterFoldMatchesCpu) {
  FERN_REQUIRE_GPU();
  ModelConfig c = test::tiny_test_config(4);
  c.hidden_size = 2048;
  c.num_attention_heads = 16;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.num_experts = 32;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  test::RandomWeightsOptions o;
  o.seed = 8;
  o.quantized = true;
  const auto hw = test::random_weights(c, o);
  std::vector<float> steps[2];
  for (int fold = 0; fold < 2; ++fold) {
    test::EnvGuard g("FERN_CUDA_MOE_FOLD", fold ? "1" : "0");
    int64_t folds = -1;
    const auto [pre, dec] = run_model(hw, 16, 8, 29, &steps[fold], &folds);
    std::printf("real-width 4-layer model, FERN_CUDA_MOE_FOLD=%d: prefill 16 NMSE %.3e top-1 %.4f | decode 8 NMSE "
                "%.3e top-1 %.4f | folds %lld\n",
                fold, pre.nmse, pre.top1, dec.nmse, dec.top1, static_cast<long long>(folds));
    EXPECT_TRUE(pre.finite && dec.finite);
    EXPECT_LT(pre.nmse, 1e-4);
    EXPECT_LT(dec.nmse, 1e-4);
    EXPECT_GE(dec.top1, 0.97);
    EXPECT_EQ(folds, fold ? 8 * 4 : 0);  // every decode step's four layers; never the prefill's chunk
  }
  const double e = test::nmse(steps[1].data(), steps[0].data(), steps[0].size());
  std::printf("  decode logits, fold vs router in the MoE launch: NMSE %.3e\n", e);
  EXPECT_LT(e, 1e-8);
}

// The HF layout binds the fused gate_up_proj [E, 2I, H] as two strided expert stacks; upload() compacts them.
void fuse_gate_up(test::OwnedStorage& st, LinearWeight& gate, LinearWeight& up) {
  const int64_t E = gate.experts, I = gate.out, H = gate.in;
  Tensor fused = st.make(DType::BF16, {E, 2 * I, H});
  auto* f = fused.ptr<uint16_t>();
  for (int64_t e = 0; e < E; ++e) {
    std::copy_n(gate.w.ptr<uint16_t>() + e * I * H, I * H, f + e * 2 * I * H);
    std::copy_n(up.w.ptr<uint16_t>() + e * I * H, I * H, f + e * 2 * I * H + I * H);
  }
  gate.w = Tensor(f, DType::BF16, {E, I, H});
  up.w = Tensor(f + I * H, DType::BF16, {E, I, H});
  gate.expert_stride = up.expert_stride = 2 * I * H;
}

TEST(CudaForward, DenseStridedExpertsMatchCpu) {
  FERN_REQUIRE_GPU();
  auto cfg = test::tiny_test_config(4);
  test::RandomWeightsOptions o;
  o.seed = 4;
  o.quantized = false;
  auto hw = test::random_weights(cfg, o);
  auto st = std::make_shared<test::OwnedStorage>();
  hw->storage.push_back(st);
  for (auto& L : hw->layers) fuse_gate_up(*st, L.moe.gate, L.moe.up);
  auto [pre, dec] = run_model(hw, 64, 8, 17);
  std::printf("bf16 model, strided experts: prefill 64 NMSE %.3e top-1 %.4f | decode 8 NMSE %.3e top-1 %.4f\n",
              pre.nmse, pre.top1, dec.nmse, dec.top1);
  // Same bound as the quantized random model (BF16 KV on the GPU is the only systematic difference).
  EXPECT_TRUE(pre.finite && dec.finite);
  EXPECT_LT(pre.nmse, 1e-4);
  EXPECT_LT(dec.nmse, 1e-4);
  EXPECT_GE(pre.top1, 0.97);
}

// The `small` synthetic checkpoint with peaked logits, and issue 5's acceptance thresholds on a run of it.
std::shared_ptr<ModelWeights> small_peaked() {
  SynthOptions so;
  so.seed = 5;
  so.logit_scale = 4.0f;
  return synth_weights(synth_preset("small"), so);
}
void expect_within(const Compare& pre, const Compare& dec, double nmse, double pre_top1, double dec_top1) {
  EXPECT_TRUE(pre.finite && dec.finite);
  EXPECT_LE(pre.nmse, nmse);
  EXPECT_LE(dec.nmse, nmse);
  EXPECT_GE(pre.top1, pre_top1);
  EXPECT_GE(dec.top1, dec_top1);
}
void expect_acceptance(const Compare& pre, const Compare& dec) { expect_within(pre, dec, 1e-3, 0.99, 0.99); }

// The `small` peaked check (192 prompt rows, 16 decode steps) with FERN_GEMM_WG_PIPE=pipe, printed.
std::pair<Compare, Compare> run_small_with_pipe(const char* pipe) {
  test::EnvGuard g("FERN_GEMM_WG_PIPE", pipe);
  auto r = run_model(small_peaked(), 192, 16, 9);
  std::printf("synth small, FERN_GEMM_WG_PIPE=%s: prefill 192 NMSE %.3e top-1 %.4f | decode 16 NMSE %.3e top-1 %.4f\n",
              pipe, r.first.nmse, r.first.top1, r.second.nmse, r.second.top1);
  return r;
}

// FERN_GEMM_WG_PIPE=q4h (opt-in, docs/notes/cuda-prefill-v13-q4h.md): every exact-code GEMM on one fp16 row of x
// (relative rounding 2^-11) instead of the bf16 hi + lo pair (~2^-16). Measured on the H200 (thirteenth session):
// prefill NMSE 8.4e-5 and top-1 0.974 on this check, against 1.0e-7 and 1.000 for the default; the same rounding
// emulated in the CPU backend alone moves this model's logits as far (NMSE 5e-5 .. 3.5e-4, top-1 0.964 .. 1.000 over
// six prompts): the random model's near-tied routing choices flip under any rounding at that level, wherever it is
// applied. So it stays opt-in and is held to the NMSE bound, with a top-1 bound of 0.95 for the prefill: a broken
// GEMM gives NMSE > 1e-2 and top-1 far below.
TEST(CudaForward, Fp16RowsGemmStaysNearTheCpu) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no sm_90a build or compute capability 9.0 device";
  auto [pre, dec] = run_small_with_pipe("q4h");
  expect_within(pre, dec, 1e-3, 0.95, 0.99);
}

// FERN_GEMM_WG_PIPE=q4 (opt-in; the default q4b puts the affine bias term on the tensor cores,
// docs/notes/cuda-prefill-v21-turns.md sections 5-6): the bias term promoted per tile by FMAs on the fp32 sums, as
// precise as the default (exact products, x as bf16 hi + lo): held to the acceptance thresholds like it.
TEST(CudaForward, PerTileBiasGemmMeetsTheAcceptanceBounds) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no sm_90a build or compute capability 9.0 device";
  auto [pre, dec] = run_small_with_pipe("q4");
  expect_acceptance(pre, dec);
}

TEST(CudaForward, SmallSynthCheckpointPeakedLogits) {
  FERN_REQUIRE_GPU();
  auto [pre, dec] = run_model(small_peaked(), 192, 64, 9);
  std::printf("synth small (logit scale 4): prefill 192 NMSE %.3e top-1 %.4f | decode 64 NMSE %.3e top-1 %.4f\n",
              pre.nmse, pre.top1, dec.nmse, dec.top1);
  expect_acceptance(pre, dec);  // the acceptance thresholds
}

TEST(CudaForward, CapturedStepReplaysLikeEagerSteps) {
  FERN_REQUIRE_GPU();
  auto cfg = test::tiny_test_config(4);
  test::RandomWeightsOptions o;
  o.seed = 8;
  o.quantized = true;
  auto hw = test::random_weights(cfg, o);
  auto gpu = test::make_gpu();
  auto dw = gpu->upload(hw);
  const int64_t V = cfg.vocab_size;
  const int n = 16, steps = 40;
  std::vector<int32_t> prompt(n);
  for (int i = 0; i < n; ++i) prompt[i] = (i * 37 + 5) % int32_t(V);
  Tensor tok = gpu->alloc(DType::I32, {1});  // the step's input slot; argmax writes the next token here
  auto prefill = [&](SequenceState& st) {
    gpu->begin_forward();
    Tensor p = gpu->scratch(DType::I32, {n});
    gpu->copy(p, Tensor(prompt.data(), DType::I32, {n}));
    Tensor l = gpu->scratch(DType::F32, {1, V});
    forward(*gpu, *dw, st, p, l);
    gpu->argmax(tok, l);
  };
  auto step = [&](SequenceState& st) {
    gpu->begin_forward();
    Tensor l = gpu->scratch(DType::F32, {1, V});
    forward(*gpu, *dw, st, tok, l);
    gpu->argmax(tok, l);
  };
  auto read_tok = [&] {
    int32_t t = -1;
    gpu->copy(Tensor(&t, DType::I32, {1}), tok);
    return t;
  };
  auto a = gpu->new_state(cfg, n + steps + 1);
  prefill(*a);
  std::vector<int32_t> eager;
  for (int s = 0; s < steps; ++s) {
    step(*a);
    eager.push_back(read_tok());
  }
  auto b = gpu->new_state(cfg, n + steps + 1);
  prefill(*b);
  gpu->capture_step(*b, [&] { step(*b); });
  EXPECT_EQ(b->pos, n);  // capturing runs nothing
  std::vector<int32_t> replayed;
  for (int s = 0; s < steps; ++s) {
    gpu->replay(*b);
    replayed.push_back(read_tok());
  }
  EXPECT_EQ(b->pos, n + steps);
  EXPECT_EQ(replayed, eager);
  std::printf("graph replay: %d steps, tokens identical to eager: %s\n", steps, replayed == eager ? "yes" : "no");
}

// Engine::decode with recorded steps (a graph per state, replayed for every later token) against the same engine
// setup decoding eagerly: greedy tokens identical, logits within 1e-10 NMSE (the same kernels on the same inputs;
// fp32 atomics in the fused kernels may add in another order, ~1e-7 relative per value, so not bit for bit). Between
// the decodes of state a: a long prefill on state b (the scratch arena grows after a's record was made) and a run on
// b (b's record replaces a's), then a again.
TEST(CudaForward, EngineRecordedDecodeMatchesEager) {
  FERN_REQUIRE_GPU();
  auto cfg = test::tiny_test_config(4);
  std::shared_ptr<const ModelWeights> hw = random_model(21, 4);
  EngineOptions on, off;
  on.decode_graph = true;
  off.decode_graph = false;
  on.max_context = off.max_context = 3000;
  Engine rec(test::make_gpu(), hw, on), eager(test::make_gpu(), hw, off);
  ASSERT_TRUE(rec.decode_graph());
  const int64_t V = cfg.vocab_size;
  auto prompt = [&](int n, int salt) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((i * 37 + salt * 101 + 5) % V);
    return p;
  };
  struct Run {
    std::unique_ptr<SequenceState> st;
    std::vector<float> logits;
  };
  auto start = [&](Engine& e, int n, int salt) {
    Run r{e.new_state(), {}};
    EXPECT_TRUE(e.prefill(*r.st, prompt(n, salt), r.logits));
    return r;
  };
  int steps = 0;
  double worst = 0;
  bool same_tokens = true;
  auto decode_both = [&](Run& r, Run& ref, int n) {
    for (int i = 0; i < n; ++i) {
      const int32_t t = argmax(r.logits), tr = argmax(ref.logits);
      same_tokens &= t == tr;
      rec.decode(*r.st, t, r.logits);
      eager.decode(*ref.st, tr, ref.logits);
      worst = std::max(worst, test::nmse(r.logits.data(), ref.logits.data(), r.logits.size()));
      ++steps;
    }
  };
  Run a = start(rec, 24, 1), ra = start(eager, 24, 1);
  decode_both(a, ra, 20);
  Run b = start(rec, 2500, 2), rb = start(eager, 2500, 2);  // a 2,500-token prefill: the arena grows
  decode_both(a, ra, 10);                                    // a's record, replayed after the growth
  decode_both(b, rb, 10);
  decode_both(a, ra, 10);
  EXPECT_TRUE(same_tokens);
  EXPECT_LT(worst, 1e-10);
  EXPECT_EQ(a.st->pos, 24 + 40);
  EXPECT_EQ(b.st->pos, 2500 + 10);
  EXPECT_EQ(rec.recorded_steps(), 3);              // a, b, a again
  EXPECT_EQ(rec.replayed_steps(), steps - 3);
  std::printf("engine recorded decode: %d steps (%lld replayed), tokens identical: %s, worst NMSE %.3g\n", steps,
              static_cast<long long>(rec.replayed_steps()), same_tokens ? "yes" : "no", worst);
}

// Engine::decode_pick on the GPU (recorded steps, the token picked on the device and fed to the next step there)
// against plain decode steps whose tokens the host picks by the same rule from the same draws: identical tokens (a
// pick differs only for a draw within ~1e-7 of a boundary between two tokens, about one in a million).
TEST(CudaForward, EngineDevicePicksAreTheHostsPicks) {
  FERN_REQUIRE_GPU();
  auto cfg = test::tiny_test_config(4);
  std::shared_ptr<const ModelWeights> hw = random_model(22, 4);
  EngineOptions eo;
  eo.max_context = 512;
  Engine dev(test::make_gpu(), hw, eo), ref(test::make_gpu(), hw, eo);
  std::vector<int32_t> prompt(13);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 53 + 9) % cfg.vocab_size);
  for (float top_p : {1.0f, 0.9f}) {
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_p = top_p;
    sp.top_k = top_p < 1.0f ? 40 : 0;
    sp.seed = 77;
    sp.logit_bias = {{3, 1.5f}};
    auto a = dev.new_state(), b = ref.new_state();
    std::vector<float> la, lb;
    ASSERT_TRUE(dev.prefill(*a, prompt, la));
    ASSERT_TRUE(ref.prefill(*b, prompt, lb));
    dev.begin_pick(sp);
    Sampler host(sp);
    std::vector<int32_t> got{dev.pick_host(la)}, want{host.sample_at(lb, pick_uniform(77, 0))};
    const int64_t device0 = dev.device_picks();
    for (int i = 1; i < 48; ++i) {
      got.push_back(dev.decode_pick(*a, got.back(), la));
      ref.decode(*b, want.back(), lb);
      want.push_back(host.sample_at(lb, pick_uniform(77, uint64_t(i))));
    }
    dev.end_pick();
    EXPECT_EQ(got, want) << "top_p " << top_p;
    EXPECT_EQ(dev.device_picks() - device0, 47) << "every step's token picked on the device";
    EXPECT_GT(dev.replayed_steps(), 0);
  }
}

}  // namespace
}  // namespace fern
