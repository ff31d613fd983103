// Chunked prefill end to end on the CUDA backend (issue 6's acceptance checks): the `small` synthetic checkpoint
// (real head dims, 64 experts, peaked logits) teacher-forced through the Engine with different prefill chunk sizes
// (one call; 256-row chunks; 37-row chunks, an awkward size that leaves a short last chunk and puts every chunk
// after the first on top of a non-empty KV cache and recurrent state), each against the CPU backend and against the
// one-call run; then greedy decode steps after the chunked prefill, against the CPU. This drives every multi-row
// path of the backend (projections, MoE, Gated DeltaNet, attention over earlier chunks) at the shapes the engine
// really gives them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "cpu/cpu_backend.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "model/synth.h"

namespace fern {
namespace {

std::unique_ptr<Engine> make_engine(std::unique_ptr<Backend> be, std::shared_ptr<const ModelWeights> w, int64_t chunk,
                                    int64_t max_context = 4096) {
  EngineOptions eo;
  eo.prefill_chunk = chunk;
  eo.max_context = max_context;
  return std::make_unique<Engine>(std::move(be), std::move(w), eo);
}

// The `small` synthetic checkpoint with peaked logits.
std::shared_ptr<const ModelWeights> small_model(uint64_t seed) {
  SynthOptions so;
  so.seed = seed;
  so.logit_scale = 4.0f;
  return synth_weights(synth_preset("small"), so);
}

// n random token ids below min(V, 151000) (the ids a tokenizer of that size produces).
std::vector<int32_t> random_prompt(int n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (auto& t : prompt) t = int32_t(rng() % uint64_t(std::min<int64_t>(V, 151000)));
  return prompt;
}

TEST(CudaPrefillChunks, ChunkedPrefillMatchesOneCallAndCpu) {
  FERN_REQUIRE_GPU();
  std::shared_ptr<const ModelWeights> hw = small_model(5);
  const int64_t V = hw->config.vocab_size;
  constexpr int kPrompt = 520;
  constexpr int kSteps = 24;
  const std::vector<int32_t> prompt = random_prompt(kPrompt, V, 21);

  // CPU reference: teacher-forced logits of every prompt position, then greedy decode.
  auto cpu = make_engine(make_cpu_backend(), hw, 4096);
  auto cst = cpu->new_state(kPrompt + kSteps + 1);
  std::vector<float> ref;
  cpu->logits_all(*cst, prompt, ref);
  std::vector<int32_t> greedy;
  std::vector<float> ref_steps, logits;
  int32_t next = int32_t(std::max_element(ref.end() - V, ref.end()) - (ref.end() - V));
  for (int i = 0; i < kSteps; ++i) {
    greedy.push_back(next);
    cpu->decode(*cst, next, logits);
    ref_steps.insert(ref_steps.end(), logits.begin(), logits.end());
    next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

  std::vector<float> one_call;
  for (int64_t chunk : {int64_t(4096), int64_t(256), int64_t(37)}) {
    auto gpu = make_engine(test::make_gpu(), hw, chunk);
    auto st = gpu->new_state(kPrompt + kSteps + 1);
    std::vector<float> got;
    gpu->logits_all(*st, prompt, got);
    const test::LogitAgreement vs_cpu = test::logit_agreement(got, ref, V);
    test::LogitAgreement vs_one;
    if (one_call.empty()) {
      one_call = got;
    } else {
      vs_one = test::logit_agreement(got, one_call, V);
    }
    // Decode after the chunked prefill, fed the CPU's greedy tokens so both sides see the same inputs.
    std::vector<float> steps;
    for (int i = 0; i < kSteps; ++i) {
      gpu->decode(*st, greedy[size_t(i)], logits);
      steps.insert(steps.end(), logits.begin(), logits.end());
    }
    const test::LogitAgreement dec = test::logit_agreement(steps, ref_steps, V);
    char vs_one_text[64] = "(the one-call reference)";
    if (chunk != 4096) std::snprintf(vs_one_text, sizeof vs_one_text, "NMSE %.3e top-1 %.4f", vs_one.nmse, vs_one.top1);
    std::printf("chunk %4lld: prefill %d vs CPU NMSE %.3e top-1 %.4f | vs one call %s | decode %d vs CPU NMSE %.3e "
                "top-1 %.4f\n",
                static_cast<long long>(chunk), kPrompt, vs_cpu.nmse, vs_cpu.top1, vs_one_text, kSteps, dec.nmse,
                dec.top1);
    // The decode issue's whole-model thresholds (NMSE <= 1e-3, top-1 >= 99%) for every comparison: the prefill
    // kernels round q, K/V and attention probabilities to bf16 (the KV cache is bf16 anyway), so the rows differ from
    // the fp32 CPU by ~1e-7..1e-5 in NMSE (the one-call runs of test_cuda_forward measured 1e-7); 1e-3 is the
    // acceptance bound, far above that and far below what a wrong chunk boundary (a lost or doubled state update:
    // NMSE ~1e-1 and top-1 collapsing) gives.
    EXPECT_TRUE(vs_cpu.finite && dec.finite);
    EXPECT_LE(vs_cpu.nmse, 1e-3);
    EXPECT_GE(vs_cpu.top1, 0.99);
    EXPECT_LE(dec.nmse, 1e-3);
    EXPECT_GE(dec.top1, 0.99);
    if (chunk != 4096) {
      EXPECT_LE(vs_one.nmse, 1e-3);
      EXPECT_GE(vs_one.top1, 0.99);
    }
  }
}

// The CUDA backend's default chunk on a large GPU is 16384 rows (prefill_chunk_hint): a prompt of 16,500 tokens in one
// 16384-row chunk plus a short one against 2048-row chunks (the default until the ninth session, which the test above
// ties to the CPU), both on the GPU (the CPU reference at this length would take minutes): the last prompt position's
// logits and 16 decode steps after it, fed the same tokens.
TEST(CudaPrefillChunks, LargeChunksMatchSmallerOnes) {
  FERN_REQUIRE_GPU();
  std::shared_ptr<const ModelWeights> hw = small_model(6);
  const int64_t V = hw->config.vocab_size;
  constexpr int kLarge = 16384;
  constexpr int kPrompt = kLarge + 116;
  constexpr int kSteps = 16;
  const std::vector<int32_t> prompt = random_prompt(kPrompt, V, 22);
  std::vector<int32_t> feed;  // the large-chunk run's greedy tokens, fed to both runs
  std::vector<float> first;
  for (int64_t chunk : {int64_t(kLarge), int64_t(2048)}) {
    auto gpu = make_engine(test::make_gpu(), hw, chunk, kPrompt + kSteps + 1);
    auto st = gpu->new_state();
    std::vector<float> logits, rows;
    ASSERT_TRUE(gpu->prefill(*st, prompt, logits));
    rows = logits;
    for (int i = 0; i < kSteps; ++i) {
      if (chunk == kLarge) feed.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      gpu->decode(*st, feed[size_t(i)], logits);
      rows.insert(rows.end(), logits.begin(), logits.end());
    }
    if (first.empty()) {
      first = rows;
      continue;
    }
    const test::LogitAgreement a = test::logit_agreement(rows, first, V);
    std::printf("prefill %d tokens, chunks of %d vs 2048: %d rows NMSE %.3e top-1 %.4f (worst row %lld: %.3e)\n",
                kPrompt, kLarge, kSteps + 1, a.nmse, a.top1, static_cast<long long>(a.worst_row), a.worst_row_nmse);
    // Same kernels, different chunk boundaries: only the order of the sums over earlier chunks changes (attention
    // tiles over the KV cache, the Gated DeltaNet chunked form's blocks, MoE row groups), ~1e-6 .. 1e-5 in the test
    // above; a lost or doubled state update at a boundary gives ~1e-1 and collapses top-1. The decode issue's bounds.
    EXPECT_TRUE(a.finite);
    EXPECT_LE(a.nmse, 1e-3);
    EXPECT_GE(a.top1, 0.99);
  }
}

}  // namespace
}  // namespace fern
