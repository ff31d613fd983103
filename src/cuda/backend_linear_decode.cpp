// A layer's input RMSNorm folded into its mixer projections for one token (decode): every block of the multi-matrix
// GEMV normalises the row while staging it (linear.cu, linear_multi_norm), so the norm needs no launch of its own.
// Several rows on the exact-code GEMM (prefill): the norm computed straight into that GEMM's input rows
// (rmsnorm_xbf_q4). Other cases (mixed formats, other GEMM forms) run rmsnorm, then linear_multi; one matrix (the
// final norm and lm_head) runs rmsnorm, then linear, unless FERN_CUDA_HEAD_NORM picks another form for comparison.
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
  const bool fold = env_choice("FERN_CUDA_NORM_FOLD", {"0", "1"}, 1) == 1 && x.numel() == D && !ws.empty() &&
                    norm_w.numel() == D && xn.numel() == D && D % 4 == 0 && D <= 4096 &&
                    cuda::linear_multi_ok(q.data(), static_cast<int>(q.size())) && ws[0]->in == D;
  // One matrix (the final norm and lm_head): FERN_CUDA_HEAD_NORM=launch (the default: rmsnorm, then linear, as
  // measured fastest), or multi, fold, fold-multi (below). Read at every call; an unknown value names the switch.
  const int head_form =
      ws.size() == 1 ? env_choice("FERN_CUDA_HEAD_NORM", {"launch", "multi", "fold", "fold-multi"}, 0) : 0;
  // Several rows (prefill): the norm computed straight into the exact-code GEMM's rows where that GEMM takes them.
  if (x.numel() > D && norm_rows_(outs, x, norm_w, eps, ws, q)) return;
  if (ws.size() == 1 && (!fold || head_form == 0)) {
    rmsnorm(xn, x, norm_w, eps);
    linear(outs[0], xn, *ws[0]);
    return;
  }
  if (!fold) {
    Backend::rmsnorm_linear_multi(outs, x, norm_w, eps, xn, ws);
    return;
  }
  const std::vector<float*> ys = out_rows(outs, ws, 1, "rmsnorm_linear_multi");
  join_side();
  // One matrix (the final norm and lm_head) under another FERN_CUDA_HEAD_NORM form, for comparisons
  // (docs/notes/cuda-decode-v25-lm-head-split.md): multi (rmsnorm, then the multi-matrix kernel), fold (the norm
  // inside the single-matrix kernel); fold-multi is the mixers' path below with one matrix.
  if (head_form == 1) {
    rmsnorm(xn, x, norm_w, eps);
    cuda::linear_multi(ctx(), q.data(), f32(xn, "rmsnorm_linear_multi xn"), ys.data(), 1, 1);
    return;
  }
  if (head_form == 2) {
    cuda::linear_norm(ctx(), q[0], f32(x, "rmsnorm_linear_multi x"), f32(norm_w, "rmsnorm_linear_multi norm"), eps,
                      f32(xn, "rmsnorm_linear_multi xn"), ys[0]);
    return;
  }
  cuda::linear_multi_norm(ctx(), q.data(), f32(x, "rmsnorm_linear_multi x"), f32(norm_w, "rmsnorm_linear_multi norm"),
                          eps, f32(xn, "rmsnorm_linear_multi xn"), ys.data(), static_cast<int>(q.size()), 1);
}

}  // namespace fern
