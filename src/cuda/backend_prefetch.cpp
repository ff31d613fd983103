// The L2 prefetch hint of decode (Backend::prefetch_layer). A decode step is a chain of latency-bound kernels that
// leaves HBM idle most of the time: the fused MoE block, for one, streams its 16 MB of expert weights in about a
// third of its ~20 us (docs/notes/cuda-decode-v5.md). The next layer's mixer weights (~14-19 MB) and Gated DeltaNet
// state (2 MB) are known before that MoE block starts, so the MoE launch asks the L2 cache (50 MB) to load them
// while it runs (cp.async.bulk.prefetch.L2); the mixer's GEMVs then read them from L2. Only for one-token steps:
// prefill reuses each weight tile over many rows and is not bound this way.
//
// FERN_CUDA_PREFETCH picks where in the MoE kernel the requests are issued (kernels.h, L2PrefetchAt): 0 off,
// 1 before its PDL wait, 2 after it, 3 after the top-k (with the expert loads in flight), 4 after the experts.
// Read at every hint, for comparisons; a captured step keeps the value it was captured with.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;
namespace {

constexpr int kPrefetchDefault = cuda::kL2PrefetchOff;
// At most this many bytes per hint: the L2 holds 50 MB, and the MoE block's own 16 MB pass through it too.
constexpr size_t kPrefetchMaxBytes = size_t(32) << 20;

int prefetch_point() {
  const char* e = std::getenv("FERN_CUDA_PREFETCH");
  if (e == nullptr || e[0] == 0) return kPrefetchDefault;
  const int v = std::atoi(e);
  return v >= cuda::kL2PrefetchOff && v <= cuda::kL2PrefetchAfterExperts ? v : kPrefetchDefault;
}

struct Range {
  const char* p;
  size_t n;
};

void add_tensor(std::vector<Range>& r, const Tensor& t) {
  if (!t.empty() && t.device == Device::Cuda && t.data != nullptr) r.push_back({static_cast<const char*>(t.data),
                                                                               t.nbytes()});
}

void add_weight(std::vector<Range>& r, const LinearWeight& w) {
  add_tensor(r, w.w);
  if (w.quantized()) {
    add_tensor(r, w.scales);
    add_tensor(r, w.biases);
  }
}

}  // namespace

void CudaBackend::prefetch_layer(const LayerWeights& next, SequenceState& state, int layer, int64_t T) {
  pending_pf_ = cuda::L2Prefetch{};
  const int at = prefetch_point();
  if (T != 1 || at == cuda::kL2PrefetchOff) return;
  std::vector<Range> r;
  add_tensor(r, next.input_norm);
  if (next.type == LayerType::LinearAttention) {
    const GdnWeights& g = next.gdn;
    for (const LinearWeight* w : {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a, &g.out_proj})
      add_weight(r, *w);
    for (const Tensor* t : {&g.conv_w, &g.A_log, &g.dt_bias, &g.norm_w}) add_tensor(r, *t);
    CudaState& st = cuda_state(state);
    if (layer >= 0 && size_t(layer) < st.recurrent_state.size()) {
      add_tensor(r, st.recurrent_state[layer]);
      add_tensor(r, st.conv_state[layer]);
    }
  } else {
    const AttnWeights& a = next.attn;
    for (const LinearWeight* w : {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj}) add_weight(r, *w);
    add_tensor(r, a.q_norm);
    add_tensor(r, a.k_norm);
  }
  // Sorted by address, neighbours merged (uploads place a layer's tensors next to each other, a few alignment
  // bytes apart), then cut to the range count and the byte cap.
  std::sort(r.begin(), r.end(), [](const Range& x, const Range& y) { return x.p < y.p; });
  std::vector<Range> m;
  for (const Range& x : r) {
    if (!m.empty() && x.p >= m.back().p && x.p <= m.back().p + m.back().n + 256) {
      m.back().n = std::max(m.back().n, size_t(x.p + x.n - m.back().p));
    } else {
      m.push_back(x);
    }
  }
  std::stable_sort(m.begin(), m.end(), [](const Range& x, const Range& y) { return x.n > y.n; });
  size_t total = 0;
  for (const Range& x : m) {
    if (pending_pf_.count == cuda::kL2PrefetchRanges) break;
    const size_t n = std::min({x.n, kPrefetchMaxBytes - total, size_t(UINT32_MAX) & ~size_t(15)});
    if (n == 0) break;
    pending_pf_.p[pending_pf_.count] = x.p;
    pending_pf_.n[pending_pf_.count] = static_cast<uint32_t>(n);
    ++pending_pf_.count;
    total += n;
  }
  pending_pf_.at = at;
}

}  // namespace fern
