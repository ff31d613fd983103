#include "model/stream_tensor.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <mutex>

namespace fern {

int64_t StreamPart::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void StreamTensor::fill_parallel(int64_t row0, int64_t n, uint8_t* const* dst) const {
  if (n <= 0) return;
  uint64_t bytes = 0;
  for (size_t p = 0; p < parts.size(); ++p) bytes += static_cast<uint64_t>(n) * row_bytes(p);
  // Small blocks are not worth waking a thread team (on a loaded machine that costs more than the work).
  if (bytes < (uint64_t(1) << 20)) {
    fill(row0, n, dst);
    return;
  }
  const int threads = std::max(1, omp_get_max_threads());
  // A few blocks per thread balances uneven rows without paying per-row call overhead.
  const int64_t blocks = std::min<int64_t>(n, int64_t(threads) * 4);
  const int64_t per = (n + blocks - 1) / blocks;
  std::exception_ptr err;
  std::mutex mu;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = b * per;
    const int64_t cnt = std::min(per, n - r0);
    if (cnt <= 0) continue;
    try {
      std::vector<uint8_t*> d(parts.size());
      for (size_t p = 0; p < parts.size(); ++p) d[p] = dst[p] + static_cast<uint64_t>(r0) * row_bytes(p);
      fill(row0 + r0, cnt, d.data());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace fern
