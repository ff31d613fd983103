// Throughput of the CPU backend's 4-bit matrix product (cpu::linear, MLX affine layout, group 64) at the model's
// shapes, for 1 input row (decode) and a few (the rows an expert gets in a prefill chunk) up to 64, on one thread
// and on all of them. Each case rotates over copies of the weight that together exceed the last-level cache, so
// the weights come from memory as they do in a forward pass (a 1.8 GB decode step reads each weight once).
// Counters: weight_GB/s (packed codes, scales and biases read per second) and GMAC/s.
//
// Usage: build/bench/bench_cpu_linear [Google Benchmark flags, e.g. --benchmark_filter=expert]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"
#include "model/weights.h"

namespace {

using fern::DType;
using fern::LinearWeight;
using fern::Tensor;

struct Shape {
  const char* name;
  int64_t out, in;
};
// A GDN layer's q/k/v/z projection rows, one routed expert's gate (or up) and down matrices, an attention layer's
// o_proj.
constexpr Shape kShapes[] = {{"gdn_in_proj", 12288, 2048}, {"expert_gate", 512, 2048}, {"expert_down", 2048, 512},
                             {"o_proj", 2048, 4096}};
constexpr int64_t kGroup = 64;
constexpr size_t kColdBytes = size_t(256) << 20;  // copies rotated per case: well past any last-level cache

// Random codes (every word nonzero), scales ~ +-N(0, 0.005) (negative ones included, as the MLX quantizer makes
// them) and biases about -8 scales, as a real group's are.
struct Matrix {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, biases;
  LinearWeight w;
  Matrix(const Shape& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.005f);
    const int64_t ng = s.in / kGroup;
    words.resize(size_t(s.out * s.in / 8));
    for (uint32_t& x : words) x = uint32_t(rng()) | 1u;
    scales.resize(size_t(s.out * ng));
    biases.resize(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
      const float sc = nd(rng);
      scales[i] = fern::f32_to_bf16(sc == 0.0f ? 1e-3f : sc);
      biases[i] = fern::f32_to_bf16(-8.0f * fern::bf16_to_f32(scales[i]) + 0.1f * nd(rng));
    }
    w.kind = LinearWeight::Kind::Affine;
    w.out = s.out;
    w.in = s.in;
    w.bits = 4;
    w.group_size = int(kGroup);
    w.name = s.name;
    w.w = Tensor(words.data(), DType::U32, {s.out, s.in / 8});
    w.scales = Tensor(scales.data(), DType::BF16, {s.out, ng});
    w.biases = Tensor(biases.data(), DType::BF16, {s.out, ng});
  }
};

// range(0): shape index, range(1): input rows T, range(2): threads (0 = all).
void BM_Linear4(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const int64_t T = state.range(1);
  const int threads = state.range(2) ? int(state.range(2)) : omp_get_max_threads();
  std::vector<std::unique_ptr<Matrix>> copies;
  copies.push_back(std::make_unique<Matrix>(s, 1));
  const size_t bytes = copies[0]->w.nbytes();
  const size_t n_copies = std::max<size_t>(1, kColdBytes / bytes);
  for (size_t i = 1; i < n_copies; ++i) copies.push_back(std::make_unique<Matrix>(s, 1 + i));
  std::mt19937_64 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * s.in)), out(size_t(T * s.out));
  for (float& v : x) v = nd(rng);
  size_t next = 0;
  for (auto _ : state) {
    fern::cpu::linear(out.data(), x.data(), T, copies[next]->w, threads);
    benchmark::DoNotOptimize(out.data());
    next = (next + 1) % copies.size();
  }
  const double calls = double(state.iterations());
  state.counters["weight_GB/s"] = benchmark::Counter(calls * double(bytes) * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GMAC/s"] =
      benchmark::Counter(calls * double(T * s.out * s.in) * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(s.name);
}

void Cases(benchmark::internal::Benchmark* b) {
  for (int64_t shape = 0; shape < int64_t(std::size(kShapes)); ++shape)
    for (int64_t T : {1, 2, 3, 8, 64})
      for (int64_t threads : {1, 0}) b->Args({shape, T, threads});
}

}  // namespace

BENCHMARK(BM_Linear4)->Apply(Cases)->ArgNames({"shape", "T", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
