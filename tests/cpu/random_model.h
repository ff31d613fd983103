// Test helper: random in-memory ModelWeights for small configurations with the real head dims (attention 256,
// Gated DeltaNet 128), as bf16 dense or MLX affine (4-bit, router and shared gate 8-bit) weights, plus a small
// MLX-style affine quantizer (MODEL.md 3b, negative scales included). Header-only because every test file is
// its own executable.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "model/weights.h"
#include "test_util.h"

namespace fern::test {

// 4 layers in the real pattern [lin, lin, lin, full] at 1/8 of the real width, 16 experts top-8.
inline ModelConfig tiny_test_config(int layers = 4) {
  ModelConfig c;
  c.model_type = "qwen3_5_moe_text";
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_hidden_layers = layers;
  c.layer_types.clear();
  for (int i = 0; i < layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 256;
  c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25;
  c.max_position_embeddings = 4096;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.num_experts = 16;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 64;
  c.shared_expert_intermediate_size = 128;
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6;
  return c;
}

struct OwnedStorage : WeightStorage {
  std::vector<HostBuffer> bufs;
  Tensor make(DType t, std::initializer_list<int64_t> dims) {
    Tensor probe(nullptr, t, dims);
    bufs.emplace_back(probe.nbytes());
    probe.data = bufs.back().data();
    return probe;
  }
};

// MLX affine quantization of `rows` rows of `in` values (MODEL.md 3b): per group the dominant extreme is the
// exact "edge" and the scale is negated when the maximum dominates.
inline void quantize_affine(const float* w, int64_t rows, int64_t in, int bits, int group, uint32_t* q,
                            uint16_t* scales, uint16_t* biases) {
  const int64_t ng = in / group, per_word = 32 / bits;
  const float qmax = float((1 << bits) - 1);
  std::fill(q, q + rows * in / per_word, 0u);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ng; ++j) {
      const float* x = w + r * in + j * group;
      const float mx = *std::max_element(x, x + group), mn = *std::min_element(x, x + group);
      float s = std::max((mx - mn) / qmax, 1e-7f);
      float edge = mn;
      if (std::fabs(mn) <= std::fabs(mx)) {
        edge = mx;
        s = -s;
      }
      const float q0 = std::round(edge / s);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        s = edge / q0;
        bias = edge;
      }
      // Stored bf16, and the codes are chosen against the stored values.
      const uint16_t sb = f32_to_bf16(s), bb = f32_to_bf16(bias);
      scales[r * ng + j] = sb;
      biases[r * ng + j] = bb;
      const float sf = bf16_to_f32(sb), bf = bf16_to_f32(bb);
      for (int64_t k = 0; k < group; ++k) {
        const float code = std::clamp(std::round((x[k] - bf) / sf), 0.0f, qmax);
        const int64_t col = j * group + k;
        q[(r * in + col) / per_word] |= uint32_t(code) << (bits * (col % per_word));
      }
    }
}

// A linear weight (or stack of `experts` > 0 matrices) holding `vals` ([experts or 1, out, in]) as bf16 (bits 16)
// or affine at `bits` 4 or 8.
inline LinearWeight make_linear(OwnedStorage& st, const std::string& name, const std::vector<float>& vals,
                                int64_t experts, int64_t out, int64_t in, int bits, int group = 64) {
  LinearWeight w;
  w.name = name;
  w.experts = experts;
  w.out = out;
  w.in = in;
  const int64_t E = std::max<int64_t>(experts, 1);
  auto dims = [&](int64_t last) { return w.shape_of(last); };
  auto make = [&](DType t, const std::vector<int64_t>& d) {
    Tensor probe(nullptr, t, d);
    st.bufs.emplace_back(probe.nbytes());
    probe.data = st.bufs.back().data();
    return probe;
  };
  if (bits == 16) {
    w.kind = LinearWeight::Kind::Dense;
    w.w = make(DType::BF16, dims(in));
    for (size_t i = 0; i < vals.size(); ++i) w.w.ptr<uint16_t>()[i] = f32_to_bf16(vals[i]);
    return w;
  }
  w.kind = LinearWeight::Kind::Affine;
  w.bits = bits;
  w.group_size = group;
  w.w = make(DType::U32, dims(in * bits / 32));
  w.scales = make(DType::BF16, dims(in / group));
  w.biases = make(DType::BF16, dims(in / group));
  quantize_affine(vals.data(), E * out, in, bits, group, w.w.ptr<uint32_t>(), w.scales.ptr<uint16_t>(),
                  w.biases.ptr<uint16_t>());
  return w;
}

struct RandomWeightsOptions {
  uint64_t seed = 1;
  bool quantized = false;  // false: bf16 dense everywhere; true: 4-bit g64, router and shared gate 8-bit
};

// Random weights scaled so that activations stay O(1) through the layers: projections ~ N(0, 1/in), norms near 1,
// decays spread over (0, 1).
inline std::shared_ptr<ModelWeights> random_weights(const ModelConfig& c, const RandomWeightsOptions& opt = {}) {
  auto mw = std::make_shared<ModelWeights>();
  auto st = std::make_shared<OwnedStorage>();
  mw->config = c;
  mw->storage.push_back(st);
  uint64_t seed = opt.seed * 1000003;
  const int main_bits = opt.quantized ? 4 : 16, gate_bits = opt.quantized ? 8 : 16;
  auto lin = [&](const std::string& name, int64_t experts, int64_t out, int64_t in, int bits, float stddev = 0) {
    const float sd = stddev > 0 ? stddev : 1.0f / std::sqrt(float(in));
    return make_linear(*st, name, randn(size_t(std::max<int64_t>(experts, 1) * out * in), ++seed, sd), experts, out,
                       in, bits);
  };
  auto vec = [&](int64_t n, float mean, float sd) {
    Tensor t = st->make(DType::F32, {n});
    auto v = randn(size_t(n), ++seed, sd);
    for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = mean + v[i];
    return t;
  };
  const int64_t H = c.hidden_size;
  mw->embed = lin("embed_tokens", 0, c.vocab_size, H, main_bits, 1.0f);
  mw->lm_head = lin("lm_head", 0, c.vocab_size, H, main_bits);
  mw->final_norm = vec(H, 1.0f, 0.1f);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights L;
    const std::string p = "layers." + std::to_string(l) + ".";
    L.type = c.layer_types[l];
    L.input_norm = vec(H, 1.0f, 0.1f);
    L.post_norm = vec(H, 1.0f, 0.1f);
    if (L.type == LayerType::LinearAttention) {
      GdnWeights& g = L.gdn;
      const int64_t Hv = c.linear_num_value_heads;
      g.in_proj_qkv = lin(p + "in_proj_qkv", 0, c.gdn_conv_dim(), H, main_bits);
      g.in_proj_z = lin(p + "in_proj_z", 0, c.gdn_value_dim(), H, main_bits);
      g.in_proj_b = lin(p + "in_proj_b", 0, Hv, H, main_bits);
      g.in_proj_a = lin(p + "in_proj_a", 0, Hv, H, main_bits);
      g.out_proj = lin(p + "out_proj", 0, H, c.gdn_value_dim(), main_bits);
      g.conv_w = vec(c.gdn_conv_dim() * c.linear_conv_kernel_dim, 0.0f, 0.5f);
      g.A_log = st->make(DType::F32, {Hv});
      auto u = randu(size_t(Hv), ++seed, 0.0f, 2.5f);  // A = exp(A_log) in [1, 12]
      for (int64_t i = 0; i < Hv; ++i) g.A_log.ptr<float>()[i] = u[i];
      g.dt_bias = vec(Hv, -1.0f, 0.5f);
      g.norm_w = vec(c.linear_value_head_dim, 1.0f, 0.1f);
    } else {
      AttnWeights& a = L.attn;
      const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
      a.q_proj = lin(p + "q_proj", 0, 2 * qd, H, main_bits);
      a.k_proj = lin(p + "k_proj", 0, kvd, H, main_bits);
      a.v_proj = lin(p + "v_proj", 0, kvd, H, main_bits);
      a.o_proj = lin(p + "o_proj", 0, H, qd, main_bits);
      a.q_norm = vec(c.head_dim, 1.0f, 0.1f);
      a.k_norm = vec(c.head_dim, 1.0f, 0.1f);
    }
    MoeWeights& m = L.moe;
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
    m.router = lin(p + "router", 0, E, H, gate_bits);
    m.gate = lin(p + "experts.gate", E, I, H, main_bits);
    m.up = lin(p + "experts.up", E, I, H, main_bits);
    m.down = lin(p + "experts.down", E, H, I, main_bits);
    m.shared_gate = lin(p + "shared.gate", 0, Is, H, main_bits);
    m.shared_up = lin(p + "shared.up", 0, Is, H, main_bits);
    m.shared_down = lin(p + "shared.down", 0, H, Is, main_bits);
    m.shared_expert_gate = lin(p + "shared_expert_gate", 0, 1, H, gate_bits);
    mw->layers.push_back(std::move(L));
  }
  return mw;
}

}  // namespace fern::test
