// The forward pass, read against MODEL.md section 2.0:
//   h = E[token]; per layer: a = Mixer(RMSNorm(h)); r = h + a; h = r + MoE(RMSNorm(r)); logits = RMSNorm(h) W_lm^T
#include "model/forward.h"

#include <fmt/format.h>

#include <span>

namespace fern {
namespace {

// Activations of the two mixers, taken from the backend's scratch once per forward call and reused by every layer,
// so scratch memory is bounded by the chunk length, not by the number of layers.
struct MixerScratch {
  Tensor mixed, z, b, a, y;  // GDN: [T, conv_dim] q|k|v, [T, value_dim], [T, Hv], [T, Hv], [T, value_dim]
  Tensor qg, k, v, o;        // attention: [T, heads*head_dim*2] per head [query|gate], [T, kv_dim] x2, [T, heads*head_dim]

  MixerScratch(Backend& be, const ModelConfig& cfg, int64_t T) {
    const DType ad = be.act_dtype();
    if (cfg.num_linear_layers() > 0) {
      mixed = be.scratch(ad, {T, cfg.gdn_conv_dim()});
      z = be.scratch(ad, {T, cfg.gdn_value_dim()});
      b = be.scratch(ad, {T, cfg.linear_num_value_heads});
      a = be.scratch(ad, {T, cfg.linear_num_value_heads});
      y = be.scratch(ad, {T, cfg.gdn_value_dim()});
    }
    if (cfg.num_attention_layers() > 0) {
      const int64_t q_dim = int64_t(cfg.num_attention_heads) * cfg.head_dim;
      const int64_t kv_dim = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
      qg = be.scratch(ad, {T, 2 * q_dim});
      k = be.scratch(ad, {T, kv_dim});
      v = be.scratch(ad, {T, kv_dim});
      o = be.scratch(ad, {T, q_dim});
    }
  }
};

// A mixer's input projections, all of one input: xn = RMSNorm(h; input_norm) is computed with them
// (rmsnorm_linear_multi, or moe_residual_project with the previous layer's MoE; a backend may fold the norm into the
// projection kernel, or run the whole in the MoE's launch).
struct Projection {
  Tensor outs[4];
  const LinearWeight* ws[4];
  size_t n = 0;
  std::span<const Tensor> out_span() const { return {outs, n}; }
  std::span<const LinearWeight* const> w_span() const { return {ws, n}; }
};

// Gated DeltaNet (MODEL.md 2.4 step 1): q|k|v, z, b, a. Attention (MODEL.md 2.3 step 1): per head [query | gate], k, v.
Projection mixer_projection(const LayerWeights& L, const MixerScratch& s) {
  if (L.type == LayerType::LinearAttention)
    return {{s.mixed, s.z, s.b, s.a}, {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a}, 4};
  return {{s.qg, s.k, s.v}, {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, nullptr}, 3};
}

// The rest of a mixer, from its projections to its output [T, H]. Gated DeltaNet: conv, gates, delta rule, gated
// norm (gdn_core), then out_proj; a backend may run the gated norm inside the projection. Attention: q/k norm, RoPE,
// KV append, attention, then o_proj.
void mixer_core(Backend& be, const LayerWeights& L, const ModelConfig& cfg, SequenceState& st, int layer,
                MixerScratch& s, Tensor out) {
  if (L.type == LayerType::LinearAttention) {
    be.gdn_core_linear(out, s.y, s.mixed, s.z, s.b, s.a, L.gdn, cfg, st, layer);
  } else {
    be.attn_core(s.o, s.qg, s.k, s.v, L.attn, cfg, st, layer);
    be.linear(out, s.o, L.attn.o_proj);
  }
}

}  // namespace

void forward(Backend& be, const ModelWeights& w, SequenceState& st, Tensor ids, Tensor logits,
             const ForwardOptions& opt) {
  const ModelConfig& cfg = w.config;
  const int64_t T = ids.dim(0);
  const int64_t H = cfg.hidden_size;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  FERN_CHECK(T >= 1, "forward with no tokens");
  FERN_CHECK(st.pos + T <= st.capacity, "state capacity {} < {} + {}", st.capacity, st.pos, T);
  const int64_t n_logits = opt.all_logits ? T : 1;
  FERN_CHECK(logits.dim(0) == n_logits && logits.dim(1) == cfg.vocab_size, "logits shape {}", logits.shape_str());
  auto dump = [&](const std::string& name, Tensor t) {
    if (opt.dump) opt.dump(name, t);
  };

  const DType ad = be.act_dtype();
  Tensor h = be.scratch(ad, {T, H});                                     // residual stream
  Tensor xn = be.scratch(ad, {T, H});                                    // normed input of a sub-block
  Tensor delta = be.scratch(ad, {T, H});                                 // sub-block output
  MixerScratch mix(be, cfg, T);
  be.embed(h, ids, w.embed);
  dump("embed", h);

  // Layer il's input projections run with layer il - 1's MoE (moe_residual_project), layer 0's on their own.
  const int n_layers = cfg.num_hidden_layers;
  if (n_layers > 0) {
    const Projection p0 = mixer_projection(w.layers[0], mix);
    be.rmsnorm_linear_multi(p0.out_span(), h, w.layers[0].input_norm, eps, xn, p0.w_span());
  }
  for (int il = 0; il < n_layers; ++il) {
    const LayerWeights& L = w.layers[il];
    mixer_core(be, L, cfg, st, il, mix, delta);
    dump(fmt::format("L{}.mixer_out", il), delta);
    // r = h + a; xn = RMSNorm(r); delta = MoE(xn); h = r + delta (then the next layer's xn and projections).
    if (il + 1 < n_layers) {
      const LayerWeights& next = w.layers[il + 1];
      const Projection p = mixer_projection(next, mix);
      be.moe_residual_project(h, delta, xn, L.post_norm, eps, delta, L.moe, cfg, next.input_norm, p.out_span(),
                              p.w_span());
    } else {
      be.moe_residual(h, delta, xn, L.post_norm, eps, delta, L.moe, cfg);
    }
    dump(fmt::format("L{}.moe_out", il), delta);
    dump(fmt::format("L{}.out", il), h);
  }
  be.rmsnorm(xn, h, w.final_norm, eps);
  // xn holds RMSNorm(h; final_norm) for every row; project the rows whose logits are wanted.
  Tensor rows = opt.all_logits ? xn : xn.slice0(T - 1, 1);
  be.linear(logits, rows, w.lm_head);
  be.advance(st, T);
}

}  // namespace fern
