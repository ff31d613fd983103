// The device token pick (src/cuda/pick.cu) against its CPU reference, the host Sampler's rule for the same draw
// (Sampler::sample_at with pick_uniform(seed, draw)): random logits at the real vocabulary and at awkward sizes (one
// block, a last block of one token, a vocabulary smaller than a candidate list), peaked, flat and tied values,
// every parameter path (greedy, temperature, min-p, top-k, top-p with and without top-k, logit bias, the three
// penalties over a prompt and the tokens fed back, each step's fed token counted by its own pick), NaN logits,
// and a pick that is switched off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "ops/token_pick.h"

namespace fern {
namespace {

struct Case {
  const char* name;
  float temperature;
  int top_k;
  float top_p, min_p;
  bool bias;
  bool penalties = false;
};

const Case kCases[] = {
    {"greedy", 0.0f, 0, 1.0f, 0.0f, false},
    {"greedy+bias", 0.0f, 0, 1.0f, 0.0f, true},
    {"t1", 1.0f, 0, 1.0f, 0.0f, false},
    {"t0.8 min_p", 0.8f, 0, 1.0f, 0.1f, false},
    {"qwen 0.7/0.8/20", 0.7f, 20, 0.8f, 0.0f, false},
    {"top_p alone", 1.0f, 0, 0.9f, 0.0f, false},
    {"top_k 64", 1.0f, 64, 1.0f, 0.0f, false},
    {"top_k 1", 1.0f, 1, 1.0f, 0.0f, false},
    {"t1.5 k5 min_p", 1.5f, 5, 1.0f, 0.2f, true},
    {"top_p+min_p+bias", 0.6f, 0, 0.95f, 0.05f, true},
    {"greedy+penalties", 0.0f, 0, 1.0f, 0.0f, false, true},
    {"qwen+penalties", 0.7f, 20, 0.8f, 0.0f, true, true},
    {"t1+penalties", 1.0f, 0, 1.0f, 0.0f, false, true},
};

// Logits of one kind. "peaked": randn x 2 with 30 tokens raised by 16 + randn x 1.5, which then hold ~99% of the
// mass at temperature 1, as a language model's few likely tokens do (a plain Gaussian spreads its mass over
// thousands of tokens, past what top-p alone keeps on the device). "tied": the same in quarter steps (many equal
// values, among the likely tokens too). "flat": randn x 0.05, nearly uniform.
std::vector<float> logits_of(const std::string& kind, int64_t V, uint64_t seed) {
  if (kind == "flat") return test::randn(size_t(V), seed, 0.05f);
  std::vector<float> l = test::randn(size_t(V), seed, 2.0f);
  const std::vector<float> lift = test::randn(30, seed + 1, 1.5f);
  for (size_t j = 0; j < lift.size(); ++j) l[(j * 7919 + seed) % size_t(V)] += 16.0f + lift[j];
  if (kind == "tied")
    for (float& x : l) x = std::round(x * 4.0f) / 4.0f;
  return l;
}

struct Tally {
  int draws = 0, mismatches = 0, host = 0;
};

// `draws` picks on the device from one set of logits, each against Sampler::sample_at for the same draw.
Tally run_case(CudaBackend& gpu, const std::vector<float>& host_logits, const Case& c, uint64_t seed, int draws) {
  const int64_t V = static_cast<int64_t>(host_logits.size());
  Tensor logits = gpu.alloc(DType::F32, {1, V});
  gpu.copy(logits, Tensor(const_cast<float*>(host_logits.data()), DType::F32, {1, V}));
  Tensor ids = gpu.alloc(DType::I32, {1});
  SamplingParams sp;
  sp.temperature = c.temperature;
  sp.top_k = c.top_k;
  sp.top_p = c.top_p;
  sp.min_p = c.min_p;
  if (c.bias)  // a strong push up, a push down, one out of range (ignored by both)
    sp.logit_bias = {{int32_t(V / 3), 6.0f}, {int32_t(V - 1), -4.0f}, {int32_t(V + 7), 9.0f}, {0, 2.5f}};
  if (c.penalties) {  // strong enough to move the picks among the likely tokens
    sp.presence_penalty = 1.5f;
    sp.frequency_penalty = 0.7f;
    sp.repetition_penalty = 1.4f;
  }
  sp.seed = seed;
  PickParams p = pick_params(sp, V);
  p.draw = 5;  // the stream need not start at draw 0
  // A prompt and tokens already fed back (with a repeat), among them likely ones, so that the penalties bite.
  std::vector<int32_t> best(static_cast<size_t>(V));
  std::iota(best.begin(), best.end(), 0);
  std::partial_sort(best.begin(), best.begin() + std::min<int64_t>(V, 16), best.end(),
                    [&](int32_t a, int32_t b) { return host_logits[size_t(a)] > host_logits[size_t(b)]; });
  std::vector<int32_t> prompt, fed;
  for (int j = 0; j < 16 && j < V; j += 2) prompt.push_back(best[size_t(j)]);
  for (int j : {0, 1, 0, 3, 5, 1}) fed.push_back(best[size_t(j)]);
  gpu.set_pick(p, sp.logit_bias, prompt, fed);
  Sampler ref(sp);
  ref.set_prompt(prompt);
  for (int32_t f : fed) ref.accept(f);
  int32_t next = int32_t(seed % size_t(V));  // the token the first step was fed
  gpu.copy(ids, Tensor(&next, DType::I32, {1}));
  Tally t;
  for (int d = 0; d < draws; ++d) {
    ref.accept(next);  // the step's fed token counts for its pick, on both sides
    gpu.pick(ids, logits);
    const int32_t got = gpu.picked();
    std::vector<float> l = host_logits;
    const int32_t want = ref.sample_at(l, pick_uniform(seed, p.draw + uint64_t(d)));
    ++t.draws;
    next = want;  // the next step is fed the host's token whoever picked (what the engine feeds on a give-up)
    if (got < 0) {
      ++t.host;
      gpu.copy(ids, Tensor(&next, DType::I32, {1}));
      continue;
    }
    int32_t slot = -1;
    gpu.copy(Tensor(&slot, DType::I32, {1}), ids);
    EXPECT_EQ(slot, got) << "the picked token goes into the input slot";
    if (got != want) {
      gpu.copy(ids, Tensor(&next, DType::I32, {1}));  // both sides go on from the same token
      ++t.mismatches;
      std::printf("  %s V %lld seed %llu draw %d: device %d, host %d (logits %.7g / %.7g)\n", c.name,
                  static_cast<long long>(V), static_cast<unsigned long long>(seed), d, got, want,
                  host_logits[size_t(got)], host_logits[size_t(want)]);
    }
  }
  gpu.clear_pick();
  return t;
}

TEST(CudaPick, MatchesTheHostSamplerForTheSameDraw) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  // 248,320: the real vocabulary (122 blocks, the last of 512 tokens); 512: one block; 4,097: a last block of one
  // token; 100,003: an odd size; 64: smaller than a top-p candidate list (every token is a candidate).
  int total = 0, mismatches = 0;
  for (int64_t V : {248320, 512, 4097, 100003, 64}) {
    for (const char* kind : {"peaked", "flat", "tied"}) {
      const auto logits = logits_of(kind, V, uint64_t(V) * 7 + kind[0]);
      for (const Case& c : kCases) {
        if (c.top_k >= V) continue;
        const Tally t = run_case(*gpu, logits, c, 1000 + uint64_t(V), 40);
        total += t.draws;
        mismatches += t.mismatches;
        const bool may_give_up = c.top_k == 0 && c.top_p < 1.0f && std::string(kind) == "flat" && V > 64;
        if (!may_give_up) {
          EXPECT_EQ(t.host, 0) << c.name << " V " << V << " " << kind;
        }
        if (c.temperature == 0.0f || c.top_k == 1) {
          EXPECT_EQ(t.mismatches, 0) << c.name << " V " << V << " " << kind << ": a maximum has one answer";
        }
        std::printf("%-18s V %6lld %-6s: %d draws, %d differ, %d left to the host\n", c.name,
                    static_cast<long long>(V), kind, t.draws, t.mismatches, t.host);
      }
    }
  }
  // Both sides sum the same weights in other orders (the device's tree sums and float exp, the host's block sums
  // and polynomial exp: ~1e-7 relative), so a draw within that distance of a boundary between two tokens may land
  // on either: about one draw in a million. 1 in 1,000 allows for a few such draws and fails on any real error
  // (a wrong cut, order or draw changes most draws of its case).
  EXPECT_LE(mismatches * 1000, total) << mismatches << " of " << total;
  std::printf("device pick: %d draws, %d differ from the host's\n", total, mismatches);
}

TEST(CudaPick, FlatTopPIsLeftToTheHost) {
  FERN_REQUIRE_GPU();
  // At the real vocabulary, top-p 0.9 over nearly uniform logits needs ~220K tokens: far past the candidates.
  auto gpu = test::make_gpu();
  const auto logits = logits_of("flat", 248320, 3);
  const Tally t = run_case(*gpu, logits, Case{"flat top_p", 1.0f, 0, 0.9f, 0.0f, false}, 7, 5);
  EXPECT_EQ(t.host, 5);
}

TEST(CudaPick, NaNLogitsAreLeftToTheHostAndOffMeansNothing) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  const int64_t V = 4097;
  std::vector<float> l = logits_of("peaked", V, 9);
  l[4096] = NAN;
  Tensor logits = gpu->alloc(DType::F32, {1, V});
  gpu->copy(logits, Tensor(l.data(), DType::F32, {1, V}));
  Tensor ids = gpu->alloc(DType::I32, {1});
  int32_t sentinel = 1234;
  gpu->copy(ids, Tensor(&sentinel, DType::I32, {1}));
  PickParams p;
  p.seed = 1;
  gpu->set_pick(p, {}, {}, {});
  gpu->pick(ids, logits);
  EXPECT_EQ(gpu->picked(), -1);  // the host's pick then fails with the NaN error
  int32_t slot = 0;
  gpu->copy(Tensor(&slot, DType::I32, {1}), ids);
  EXPECT_EQ(slot, sentinel);
  // Off: pick() enqueues launches that do nothing.
  gpu->clear_pick();
  l[4096] = 0.0f;
  gpu->copy(logits, Tensor(l.data(), DType::F32, {1, V}));
  gpu->pick(ids, logits);
  gpu->synchronize();
  gpu->copy(Tensor(&slot, DType::I32, {1}), ids);
  EXPECT_EQ(slot, sentinel);
  // On again: the NaN flag was cleared by the pick that saw it.
  gpu->set_pick(p, {}, {}, {});
  gpu->pick(ids, logits);
  EXPECT_GE(gpu->picked(), 0);
}

}  // namespace
}  // namespace fern
