// The ranges of an L2Prefetch from the pieces of memory a kernel will read (l2_prefetch.h).
#include "cuda/l2_prefetch.h"

#include <algorithm>
#include <vector>

namespace fern::cuda {

L2Prefetch l2_prefetch_ranges(std::span<const L2Piece> pieces, int mode) {
  L2Prefetch pf;
  if (mode == 0) return pf;
  std::vector<L2Piece> v;
  for (const L2Piece& q : pieces)
    if (q.p != nullptr && q.bytes > 0) v.push_back(q);
  std::sort(v.begin(), v.end(), [](const L2Piece& a, const L2Piece& b) { return a.p < b.p; });
  std::vector<L2Piece> merged;  // pieces closer than kL2PrefetchGap bytes become one range (gap included)
  for (const L2Piece& q : v) {
    if (!merged.empty()) {
      L2Piece& m = merged.back();
      const char* end = m.p + m.bytes;
      if (q.p <= end + kL2PrefetchGap) {
        m.bytes = std::max<size_t>(m.bytes, size_t(q.p + q.bytes - m.p));
        continue;
      }
    }
    merged.push_back(q);
  }
  size_t budget = kL2PrefetchMaxBytes;
  for (const L2Piece& m : merged) {
    if (pf.n == kL2PrefetchRanges || budget == 0) break;
    // Whole 16-byte units inside the piece (the bulk prefetch's alignment and size).
    const uintptr_t a = (reinterpret_cast<uintptr_t>(m.p) + 15) & ~uintptr_t(15);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(m.p) + m.bytes) & ~uintptr_t(15);
    if (e <= a) continue;
    const size_t n = std::min<size_t>({size_t(e - a), budget, size_t(UINT32_MAX) & ~size_t(15)});
    pf.p[pf.n] = reinterpret_cast<const char*>(a);
    pf.bytes[pf.n] = static_cast<uint32_t>(n);
    ++pf.n;
    budget -= n;
  }
  pf.mode = pf.n > 0 ? mode : 0;
  return pf;
}

}  // namespace fern::cuda
