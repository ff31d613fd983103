#include "model/cost.h"

namespace fern {
namespace {

// Bytes of one expert's matrix in a stack (the stack's bytes divided by its expert count).
double per_expert(const LinearWeight& w) { return w.experts > 0 ? double(w.nbytes()) / double(w.experts) : 0.0; }

double params(const LinearWeight& w) { return double(w.out) * double(w.in) * double(w.experts > 0 ? w.experts : 1); }

}  // namespace

DecodeCost decode_cost(const ModelWeights& w, int64_t context, int kv_elem_bytes) {
  const ModelConfig& c = w.config;
  DecodeCost r;
  double wb = 0;
  for (const LayerWeights& L : w.layers) {
    wb += double(L.input_norm.nbytes() + L.post_norm.nbytes());
    if (L.type == LayerType::LinearAttention) {
      const GdnWeights& g = L.gdn;
      wb += double(g.in_proj_qkv.nbytes() + g.in_proj_z.nbytes() + g.in_proj_b.nbytes() + g.in_proj_a.nbytes() +
                   g.out_proj.nbytes() + g.conv_w.nbytes() + g.A_log.nbytes() + g.dt_bias.nbytes() +
                   g.norm_w.nbytes());
    } else {
      const AttnWeights& a = L.attn;
      wb += double(a.q_proj.nbytes() + a.k_proj.nbytes() + a.v_proj.nbytes() + a.o_proj.nbytes() +
                   a.q_norm.nbytes() + a.k_norm.nbytes());
    }
    const MoeWeights& m = L.moe;
    wb += double(m.router.nbytes() + m.shared_gate.nbytes() + m.shared_up.nbytes() + m.shared_down.nbytes() +
                 m.shared_expert_gate.nbytes());
    wb += c.num_experts_per_tok * (per_expert(m.gate) + per_expert(m.up) + per_expert(m.down));
  }
  wb += double(w.lm_head.nbytes()) + double(w.final_norm.nbytes());
  if (w.embed.out > 0) wb += double(w.embed.nbytes()) / double(w.embed.out);  // one row
  r.weight_bytes = wb;
  const double n_lin = c.num_linear_layers();
  r.state_bytes = n_lin * (2.0 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4.0 +
                           2.0 * double(c.linear_conv_kernel_dim - 1) * double(c.gdn_conv_dim()) * 4.0);
  r.kv_bytes = double(c.num_attention_layers()) * 2.0 * c.num_key_value_heads * c.head_dim * double(kv_elem_bytes) *
               double(context);
  return r;
}

double prefill_flops(const ModelConfig& c, const ModelWeights& w, int64_t n) {
  double p = 0;
  for (const LayerWeights& L : w.layers) {
    if (L.type == LayerType::LinearAttention) {
      const GdnWeights& g = L.gdn;
      p += params(g.in_proj_qkv) + params(g.in_proj_z) + params(g.in_proj_b) + params(g.in_proj_a) +
           params(g.out_proj);
    } else {
      const AttnWeights& a = L.attn;
      p += params(a.q_proj) + params(a.k_proj) + params(a.v_proj) + params(a.o_proj);
    }
    const MoeWeights& m = L.moe;
    p += params(m.router) + params(m.shared_gate) + params(m.shared_up) + params(m.shared_down) +
         params(m.shared_expert_gate);
    p += c.num_experts_per_tok * double(m.gate.out * m.gate.in + m.up.out * m.up.in + m.down.out * m.down.in);
  }
  const double linear = 2.0 * p * double(n);
  // Causal attention: per layer and query head, QK^T and PV over on average n/2 keys, 2 FLOPs per MAC.
  const double attn = double(c.num_attention_layers()) * c.num_attention_heads * 2.0 * 2.0 * c.head_dim *
                      (double(n) * double(n) / 2.0);
  return linear + attn;
}

}  // namespace fern
