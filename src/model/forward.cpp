// The forward pass, read against MODEL.md section 2.0:
//   h = E[token]; per layer: a = Mixer(RMSNorm(h)); r = h + a; h = r + MoE(RMSNorm(r)); logits = RMSNorm(h) W_lm^T
#include "model/forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace fern {
namespace {

// Activations of the two mixers, taken from the backend's scratch once per forward call and reused by every layer,
// so scratch memory is bounded by the chunk length, not by the number of layers. A layer runs one mixer and its
// activations are dead once the mixer's output projection has run, so the two sets share one region (stream order
// on a GPU): per token of a chunk ~64 KB for the model's GDN set instead of ~116 KB for both.
struct MixerScratch {
  Tensor mixed, z, b, a, y;  // GDN: [T, conv_dim] q|k|v, [T, value_dim], [T, Hv], [T, Hv], [T, value_dim]
  Tensor qg, k, v, o;        // attention: [T, heads*head_dim*2] per head [query|gate], [T, kv_dim] x2, [T, heads*head_dim]

  MixerScratch(Backend& be, const ModelConfig& cfg, int64_t T) {
    const DType ad = be.act_dtype();
    const int64_t q_dim = int64_t(cfg.num_attention_heads) * cfg.head_dim;
    const int64_t kv_dim = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
    const bool gdn = cfg.num_linear_layers() > 0, attn = cfg.num_attention_layers() > 0;
    const std::vector<int64_t> gdn_widths = {cfg.gdn_conv_dim(), cfg.gdn_value_dim(), cfg.linear_num_value_heads,
                                             cfg.linear_num_value_heads, cfg.gdn_value_dim()};
    const std::vector<int64_t> attn_widths = {2 * q_dim, kv_dim, kv_dim, q_dim};
    // Each tensor on a 256-byte boundary of the region (the kernels' vector loads want 16).
    auto padded_bytes = [&](int64_t width) { return (size_t(T) * size_t(width) * dtype_size(ad) + 255) / 256 * 256; };
    auto bytes_of = [&](const std::vector<int64_t>& widths) {
      size_t n = 0;
      for (int64_t w : widths) n += padded_bytes(w);
      return n;
    };
    const size_t bytes = std::max(gdn ? bytes_of(gdn_widths) : 0, attn ? bytes_of(attn_widths) : 0);
    if (bytes == 0) return;
    const Tensor region = be.scratch(DType::U8, {int64_t(bytes)});
    auto carve = [&](const std::vector<int64_t>& widths, std::initializer_list<Tensor*> out) {
      size_t off = 0;
      auto w = widths.begin();
      for (Tensor* t : out) {
        *t = Tensor(static_cast<char*>(region.data) + off, ad, {T, *w}, region.device);
        off += padded_bytes(*w++);
      }
    };
    if (gdn) carve(gdn_widths, {&mixed, &z, &b, &a, &y});
    if (attn) carve(attn_widths, {&qg, &k, &v, &o});
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
  MixerScratch mix(be, cfg, T);
  be.embed(h, ids, w.embed);
  dump("embed", h);

  for (int il = 0; il < cfg.num_hidden_layers; ++il) {
    const LayerWeights& L = w.layers[il];
    if (L.type == LayerType::LinearAttention)
      gdn_mixer(be, L.gdn, cfg, st, il, h, L.input_norm, eps, xn, mix, delta);
    else
      attn_mixer(be, L.attn, cfg, st, il, h, L.input_norm, eps, xn, mix, delta);
    dump(fmt::format("L{}.mixer_out", il), delta);
    // r = h + a; xn = RMSNorm(r); delta = MoE(xn); h = r + delta.
    be.moe_residual(h, delta, xn, L.post_norm, eps, delta, L.moe, cfg);
    dump(fmt::format("L{}.moe_out", il), delta);
    dump(fmt::format("L{}.out", il), h);
  }
  // The final norm and lm_head on the rows whose logits are wanted (a prompt chunk's last row, or all of them).
  Tensor rows = opt.all_logits ? xn : xn.slice0(T - 1, 1);
  be.rmsnorm(rows, opt.all_logits ? h : h.slice0(T - 1, 1), w.final_norm, eps);
  be.linear(logits, rows, w.lm_head);
  be.advance(st, T);
}

}  // namespace fern
