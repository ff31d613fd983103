// Time to pick one token from a vocabulary of logits (fern::Sampler::sample), which the served generation loop pays
// on the host for every token, whatever the backend: at Qwen3.6's 248,320 tokens a scalar sampler costs
// milliseconds, longer than a GPU decode step. Cases: the request parameters clients send (greedy, the OpenAI
// default temperature 1, Qwen's recommended settings with and without thinking, top-p alone, min-p), on two
// shapes of logits: `peaked` (a few tokens hold most of the mass, as a trained model's do) and `flat` (random
// logits, as the synthetic models give). Each iteration copies the logits first (sample() scales them in place);
// the copy is timed apart as `copy_only` to subtract.
//
// Usage: build/bench/bench_sampler [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

using fern::SamplingParams;

constexpr int64_t kVocab = 248320;

std::vector<float> make_logits(bool peaked) {
  std::mt19937_64 rng(peaked ? 1 : 2);
  std::normal_distribution<float> nd(0.0f, peaked ? 2.0f : 1.0f);
  std::vector<float> l(kVocab);
  for (float& x : l) x = nd(rng);
  if (peaked) {  // eight tokens 20 down to 16.5 above the crowd: ~40% for the first, the crowd ~0.5% at T = 1
    for (int i = 0; i < 8; ++i) l[size_t(i) * 30011 % kVocab] += 20.0f - 0.5f * float(i);
  }
  return l;
}

SamplingParams params(int which) {
  SamplingParams p;
  p.seed = 1;
  switch (which) {
    case 0: p.temperature = 0.0f; break;                                  // greedy
    case 1: p.temperature = 1.0f; break;                                  // OpenAI's default
    case 2: p.temperature = 0.7f; p.top_p = 0.8f; p.top_k = 20; break;    // Qwen, no thinking
    case 3: p.temperature = 0.6f; p.top_p = 0.95f; p.top_k = 20; break;   // Qwen, thinking
    case 4: p.temperature = 1.0f; p.top_p = 0.95f; break;                 // top-p alone
    case 5: p.temperature = 1.0f; p.min_p = 0.05f; break;                 // min-p
  }
  return p;
}

const char* kNames[] = {"greedy", "t1", "t0.7_p0.8_k20", "t0.6_p0.95_k20", "t1_p0.95", "t1_minp0.05"};

void BM_sample(benchmark::State& state) {
  const bool peaked = state.range(0) != 0;
  const int which = static_cast<int>(state.range(1));
  const std::vector<float> base = make_logits(peaked);
  fern::Sampler s(params(which));
  std::vector<float> l(base.size());
  for (auto _ : state) {
    l = base;
    benchmark::DoNotOptimize(s.sample(l));
  }
  state.SetLabel(std::string(peaked ? "peaked/" : "flat/") + kNames[which]);
  state.counters["tokens/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_copy_only(benchmark::State& state) {
  const std::vector<float> base = make_logits(true);
  std::vector<float> l(base.size());
  for (auto _ : state) {
    l = base;
    benchmark::DoNotOptimize(l.data());
  }
}

BENCHMARK(BM_sample)->ArgsProduct({{1, 0}, {0, 1, 2, 3, 4, 5}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_copy_only)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
