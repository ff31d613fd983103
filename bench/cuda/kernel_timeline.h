// Kernel start/end times of real graph replays, from CUPTI's activity records (no Nsight Systems on the GPU machine;
// Nsight Compute serializes kernels, which hides exactly the launch gaps and PDL overlaps that bound a decode step).
// Header-only, for the benchmarks; compiled only where the build found CUPTI (FERN_HAVE_CUPTI).
#pragma once
#ifdef FERN_HAVE_CUPTI
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace fern::bench {

struct KernelSpan {
  std::string name;
  uint64_t start = 0, end = 0;  // ns, CUPTI's clock
  uint64_t graph_node = 0;      // the graph node that launched it (0 outside graphs)
  int grid = 0, block = 0;      // blocks and threads per block
  uint32_t stream = 0;          // CUPTI's stream id
};

namespace timeline_detail {
inline std::mutex mu;
inline std::vector<KernelSpan> spans;
constexpr size_t kBufBytes = 16u << 20;

inline void check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* s = nullptr;
    cuptiGetResultString(r, &s);
    std::fprintf(stderr, "CUPTI %s: %s\n", what, s ? s : "?");
    std::exit(1);
  }
}

inline void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

inline void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    spans.push_back({k->name ? k->name : "?", k->start, k->end, k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                     k->blockX * k->blockY * k->blockZ, k->streamId});
  }
  std::free(buf);
}
}  // namespace timeline_detail

// Records every kernel that runs between start() and stop(); stop() returns them sorted by start time.
class KernelTimeline {
 public:
  void start() {
    using namespace timeline_detail;
    static bool registered = false;
    if (!registered) {
      check(cuptiActivityRegisterCallbacks(requested, completed), "register");
      registered = true;
    }
    spans.clear();
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable");
  }
  std::vector<KernelSpan> stop() {
    using namespace timeline_detail;
    check(cuptiActivityFlushAll(1), "flush");
    check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable");
    std::lock_guard<std::mutex> lock(mu);
    std::vector<KernelSpan> out = std::move(spans);
    spans.clear();
    std::sort(out.begin(), out.end(), [](const KernelSpan& a, const KernelSpan& b) { return a.start < b.start; });
    return out;
  }
};

// A kernel's demangled name without scopes and parameter list ("void fern::cuda::(anonymous
// namespace)::linear_kernel<4, 2>(...)" -> "linear_kernel<4, 2>"), at most 40 characters.
inline std::string short_kernel_name(const std::string& mangled) {
  int status = 0;
  char* dem = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && dem ? dem : mangled;
  std::free(dem);
  for (size_t a; (a = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(a, 23);
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s = s.substr(0, paren);
  int depth = 0;
  size_t cut = 0;
  for (size_t i = 0; i < s.size(); ++i) {  // the last "::" outside template brackets
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':') cut = i + 2;
  }
  s = s.substr(cut);
  const size_t sp = s.rfind(' ', s.find('<'));
  if (sp != std::string::npos && sp < s.find('<')) s = s.substr(sp + 1);
  return s.size() > 40 ? s.substr(0, 40) : s;
}

}  // namespace fern::bench
#endif  // FERN_HAVE_CUPTI
