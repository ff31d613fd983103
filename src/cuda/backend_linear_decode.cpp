// A layer's input RMSNorm folded into its mixer projections for one token (decode): every block of the multi-matrix
// GEMV normalises the row while staging it (linear.cu, linear_multi_norm), so the norm needs no launch of its own.
// Other cases (several rows, mixed formats) run rmsnorm, then linear_multi.
#include "core/env.h"
#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;

void CudaBackend::rmsnorm_linear_multi(std::span<const Tensor> outs, Tensor x, Tensor norm_w, float eps, Tensor xn,
                                       std::span<const LinearWeight* const> ws) {
  FERN_CHECK(outs.size() == ws.size(), "rmsnorm_linear_multi: {} outputs for {} weights", outs.size(), ws.size());
  const int64_t D = x.dim(-1);
  std::vector<cuda::QW> q;
  for (const LinearWeight* w : ws) q.push_back(cuda::make_qw(*w));
  // FERN_CUDA_NORM_FOLD=0: the norm as its own launch before the projections (for comparisons; read at every call,
  // an unknown value is an error naming the switch). 1, the default: inside the projection kernel for one row.
  // Measured on the H200 (docs/notes/cuda-decode-v25-lm-head-split.md, section 4): 612.0 vs 603.8 tok/s at 4K,
  // 434.8 vs 430.6 at 128K; the projections 10.33 us folded against 9.37 + 1.42 for the norm's launch.
  const bool fold = env_choice("FERN_CUDA_NORM_FOLD", {"0", "1"}, 1) == 1 && x.numel() == D && !ws.empty() && norm_w.numel() == D && xn.numel() == D && D % 4 == 0 && D <= 4096 &&
                    cuda::linear_multi_ok(q.data(), static_cast<int>(q.size())) && ws[0]->in == D;
  if (!fold) {
    Backend::rmsnorm_linear_multi(outs, x, norm_w, eps, xn, ws);
    return;
  }
  std::vector<float*> ys;
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = *ws[i];
    FERN_CHECK(outs[i].dim(-1) == w.out && outs[i].numel() == w.out, "rmsnorm_linear_multi {}: out {} for [{}, {}]",
               w.name, outs[i].shape_str(), w.out, w.in);
    ys.push_back(f32(outs[i], "rmsnorm_linear_multi out"));
  }
  join_side();
  cuda::linear_multi_norm(ctx(), q.data(), f32(x, "rmsnorm_linear_multi x"), f32(norm_w, "rmsnorm_linear_multi norm"),
                          eps, f32(xn, "rmsnorm_linear_multi xn"), ys.data(), static_cast<int>(q.size()), 1);
}

}  // namespace fern
