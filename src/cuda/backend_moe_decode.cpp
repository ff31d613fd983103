// Sparse MoE block for one token (decode): the whole block in one launch (moe_fused.cu) where the formats allow,
// otherwise fused router + top-k, the selected experts' gate/up with SiLU*up, and down with the routing weights and
// the gated shared expert (moe.cu). Shapes are checked by moe().
#include <cstdlib>
#include <cstring>

#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;
namespace {

// FERN_CUDA_MOE_FUSED=0 keeps the three launches (for comparisons).
bool fused_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("FERN_CUDA_MOE_FUSED");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

}  // namespace

void CudaBackend::moe_decode_(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) {
  const int T = static_cast<int>(x.dim(0));
  const int k = cfg.num_experts_per_tok;
  const int64_t E = w.router.out, I = w.gate.out, Is = w.shared_gate.out;
  cuda::MoeScratch s;
  s.router_logits = scratch(DType::F32, {T, E}).ptr<float>();
  s.sgate_logit = scratch(DType::F32, {T}).ptr<float>();
  s.topk_ids = scratch(DType::I32, {T, k}).ptr<int32_t>();
  s.topk_w = scratch(DType::F32, {T, k}).ptr<float>();
  s.sgate = scratch(DType::F32, {T}).ptr<float>();
  s.h = scratch(DType::F32, {T, k * I + Is}).ptr<float>();
  const float* xp = f32(x, "moe x");
  float* op = f32(out, "moe out");
  // The fused kernel's counters share the GDN slice (backend_internal.h).
  if (T == 1 && fused_enabled() && cfg.linear_num_key_heads + cfg.linear_num_value_heads <= kMoeFusedCounterBase) {
    const cuda::MoeQW q{cuda::make_qw(w.router), cuda::make_qw(w.shared_expert_gate), cuda::make_qw(w.gate),
                        cuda::make_qw(w.up),     cuda::make_qw(w.down),               cuda::make_qw(w.shared_gate),
                        cuda::make_qw(w.shared_up), cuda::make_qw(w.shared_down)};
    if (cuda::moe_fused(ctx(kMoeFusedCounterBase, cuda::kMoeFusedCounters), q, xp, s, op, k)) return;
  }
  cuda::moe_route(ctx(kMoeCounterBase, kCounters - kMoeCounterBase), cuda::make_qw(w.router),
                  cuda::make_qw(w.shared_expert_gate), xp, s, T, k);
  cuda::moe_gate_up(ctx(), cuda::make_qw(w.gate), cuda::make_qw(w.up), cuda::make_qw(w.shared_gate),
                    cuda::make_qw(w.shared_up), xp, s, T, k);
  cuda::moe_down(ctx(), cuda::make_qw(w.down), cuda::make_qw(w.shared_down), s, op, T, k);
}

}  // namespace fern
