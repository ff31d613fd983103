// The next token picked on the device (src/cuda/pick.cu) against what the host path pays for the same token: the
// copy of the logits into pageable host memory and Sampler::sample_at. Logits at the real vocabulary (248,320), a
// language model's shape (randn x 2 with 30 tokens raised by ~16, which hold ~99% of the mass), per parameter set:
//   device   one pick (three launches), the median of 7 rounds of 32 picks enqueued back to back, per pick;
//   copy     the 1 MB device-to-host copy into a std::vector (what Engine::decode does), median of 7;
//   host     Sampler::sample_at on the host copy, median of 7.
// Usage: bench_cuda_pick [vocabulary (248320)]
#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_timing.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_backend_impl.h"
#include "engine/sampler.h"
#include "ops/token_pick.h"

namespace {

using fern::CudaBackend;
using fern::DType;
using fern::Tensor;

std::vector<float> lm_like_logits(int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = 2.0f * n(rng);
  for (int j = 0; j < 30; ++j) l[(size_t(j) * 7919 + seed) % size_t(V)] += 16.0f + 1.5f * n(rng);
  return l;
}

double median_host_us(const std::function<void()>& f, int reps = 7) {
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t V = argc > 1 ? std::atoll(argv[1]) : 248320;
  if (!fern::cuda_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  if (!fern::cuda::pick_supported(V)) {
    std::fprintf(stderr, "a vocabulary of %lld tokens is past the device pick's %d candidate slots\n",
                 static_cast<long long>(V), fern::cuda::kPickSortSlots);
    return 2;
  }
  CudaBackend gpu(0);
  const std::vector<float> host = lm_like_logits(V, 5);
  Tensor logits = gpu.alloc(DType::F32, {1, V});
  gpu.copy(logits, Tensor(const_cast<float*>(host.data()), DType::F32, {1, V}));
  Tensor ids = gpu.alloc(DType::I32, {1});
  struct Case {
    const char* name;
    float t;
    int k;
    float p, min_p;
  };
  const Case cases[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f},       {"temperature 1", 1.0f, 0, 1.0f, 0.0f},
                        {"t 0.8, min-p 0.1", 0.8f, 0, 1.0f, 0.1f}, {"0.7 / top-p 0.8 / top-k 20", 0.7f, 20, 0.8f, 0.0f},
                        {"top-p 0.95 alone", 1.0f, 0, 0.95f, 0.0f}, {"top-k 64", 1.0f, 64, 1.0f, 0.0f}};
  std::printf("## Device pick vs the host path, V = %lld\n\n", static_cast<long long>(V));
  std::printf("| parameters | device pick (us) | copy 1 MB to host (us) | host pick (us) | host / device |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  std::vector<float> copy(static_cast<size_t>(V));
  const double copy_us = median_host_us([&] { gpu.copy(Tensor(copy.data(), DType::F32, {1, V}), logits); });
  for (const Case& c : cases) {
    fern::SamplingParams sp;
    sp.temperature = c.t;
    sp.top_k = c.k;
    sp.top_p = c.p;
    sp.min_p = c.min_p;
    sp.seed = 11;
    gpu.set_pick(fern::pick_params(sp, V), {}, {}, {});
    constexpr int kPicks = 32;
    const double dev_ms = fern::bench::median_ms(gpu.stream(), [&] {
      for (int i = 0; i < kPicks; ++i) gpu.pick(ids, logits);
    });
    const bool on_device = gpu.picked() >= 0;
    gpu.clear_pick();
    fern::Sampler s(sp);
    std::vector<double> us;
    for (uint64_t draw = 0; draw < 7; ++draw) {
      std::vector<float> l = host;  // sample_at scales in place: a fresh copy each time, not timed
      const auto t0 = std::chrono::steady_clock::now();
      (void)s.sample_at(l, fern::pick_uniform(11, draw));
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    const double host_us = us[us.size() / 2];
    const double dev_us = dev_ms * 1000.0 / kPicks;
    std::printf("| %s | %.1f%s | %.1f | %.1f | %.1fx |\n", c.name, dev_us, on_device ? "" : " (left to the host)",
                copy_us, host_us, (copy_us + host_us) / dev_us);
  }
  return 0;
}
