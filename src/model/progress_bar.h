// A one-line stderr progress bar for long checkpoint jobs (`fern synth`, `fern quantize`, loading), redrawn at
// most once per percent. Not thread-safe: call update() from one thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fern {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)), start_(std::chrono::steady_clock::now()) {}
  void update(uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)) : 100;
    if (pct == last_) return;
    last_ = pct;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::string bar(static_cast<size_t>(pct / 4), '#');
    bar.resize(25, '.');
    std::fprintf(stderr, "\r%s [%s] %3d%% %.2f/%.2f GB %.0fs", label_.c_str(), bar.c_str(), pct, done / 1e9,
                 total / 1e9, secs);
    if (pct >= 100) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  int last_ = -1;
};

}  // namespace fern
