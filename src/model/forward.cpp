// The forward pass, read against MODEL.md section 2.0:
//   h = E[token]; per layer: a = Mixer(RMSNorm(h)); r = h + a; h = r + MoE(RMSNorm(r)); logits = RMSNorm(h) W_lm^T
#include "model/forward.h"

#include <fmt/format.h>

namespace fern {
namespace {

// Activations of one layer's mixer, taken from the backend's scratch inside a scratch scope that closes once the
// mixer's output projection has run, so the layer's MoE reuses the memory: a chunk's scratch holds the larger of the
// two blocks' temporaries, not their sum, and does not grow with the number of layers.
struct MixerScratch {
  Tensor mixed, z, b, a, y;  // GDN: [T, conv_dim] q|k|v, [T, value_dim], [T, Hv], [T, Hv], [T, value_dim]
  Tensor qg, k, v, o;        // attention: [T, heads*head_dim*2] per head [query|gate], [T, kv_dim] x2, [T, heads*head_dim]

  MixerScratch(Backend& be, const ModelConfig& cfg, LayerType type, int64_t T) {
    const DType ad = be.act_dtype();
    if (type == LayerType::LinearAttention) {
      const int64_t Hv = cfg.linear_num_value_heads;
      mixed = be.scratch(ad, {T, cfg.gdn_conv_dim()});
      z = be.scratch(ad, {T, cfg.gdn_value_dim()});
      b = be.scratch(ad, {T, Hv});
      a = be.scratch(ad, {T, Hv});
      y = be.scratch(ad, {T, cfg.gdn_value_dim()});
    } else {
      const int64_t q_dim = int64_t(cfg.num_attention_heads) * cfg.head_dim;
      const int64_t kv_dim = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
      qg = be.scratch(ad, {T, 2 * q_dim});
      k = be.scratch(ad, {T, kv_dim});
      v = be.scratch(ad, {T, kv_dim});
      o = be.scratch(ad, {T, q_dim});
    }
  }
};

// The mixers take the residual stream h and the layer's input norm: xn = RMSNorm(h) is computed with the
// projections (rmsnorm_linear_multi; a backend may fold the norm into the projection kernel).
// Gated DeltaNet mixer (MODEL.md 2.4): projections, then the fused core with the output projection.
void gdn_mixer(Backend& be, const GdnWeights& w, const ModelConfig& cfg, SequenceState& st, int layer, Tensor h,
               Tensor norm_w, float eps, Tensor xn, MixerScratch& s, Tensor out) {
  const Tensor proj_out[] = {s.mixed, s.z, s.b, s.a};  // four projections of one input: one launch where supported
  const LinearWeight* const proj_w[] = {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a};
  be.rmsnorm_linear_multi(proj_out, h, norm_w, eps, xn, proj_w);
  // Conv, gates, delta rule, gated norm (gdn_core), then out_proj -> [T, H]; a backend may run the gated norm
  // inside the projection.
  be.gdn_core_linear(out, s.y, s.mixed, s.z, s.b, s.a, w, cfg, st, layer);
}

// Gated attention mixer (MODEL.md 2.3).
void attn_mixer(Backend& be, const AttnWeights& w, const ModelConfig& cfg, SequenceState& st, int layer, Tensor h,
                Tensor norm_w, float eps, Tensor xn, MixerScratch& s, Tensor out) {
  const Tensor proj_out[] = {s.qg, s.k, s.v};  // three projections of one input: one launch where supported
  const LinearWeight* const proj_w[] = {&w.q_proj, &w.k_proj, &w.v_proj};
  be.rmsnorm_linear_multi(proj_out, h, norm_w, eps, xn, proj_w);
  be.attn_core(s.o, s.qg, s.k, s.v, w, cfg, st, layer);                 // q/k norm, RoPE, KV append, attention
  be.linear(out, s.o, w.o_proj);                                          // [T, H]
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
  be.embed(h, ids, w.embed);
  dump("embed", h);

  for (int il = 0; il < cfg.num_hidden_layers; ++il) {
    const LayerWeights& L = w.layers[il];
    be.expect_moe_residual(h, delta, L.post_norm, L.moe, cfg);  // a backend may start it in the mixer's out_proj
    be.scratch_push();  // the mixer's activations, dead once its output projection has run
    {
      MixerScratch mix(be, cfg, L.type, T);
      if (L.type == LayerType::LinearAttention)
        gdn_mixer(be, L.gdn, cfg, st, il, h, L.input_norm, eps, xn, mix, delta);
      else
        attn_mixer(be, L.attn, cfg, st, il, h, L.input_norm, eps, xn, mix, delta);
    }
    be.scratch_pop();
    dump(fmt::format("L{}.mixer_out", il), delta);
    // r = h + a; xn = RMSNorm(r); delta = MoE(xn); h = r + delta.
    be.moe_residual(h, delta, xn, L.post_norm, eps, delta, L.moe, cfg);
    dump(fmt::format("L{}.moe_out", il), delta);
    dump(fmt::format("L{}.out", il), h);
  }
  // The final norm and lm_head on the rows whose logits are wanted (a prompt chunk's last row, or all of them); a
  // backend may compute the norm inside the lm_head kernel, as for the mixers' projections.
  const Tensor head_out[] = {logits};
  const LinearWeight* const head_w[] = {&w.lm_head};
  be.rmsnorm_linear_multi(head_out, opt.all_logits ? h : h.slice0(T - 1, 1), w.final_norm, eps,
                          opt.all_logits ? xn : xn.slice0(T - 1, 1), head_w);
  be.advance(st, T);
}

}  // namespace fern
