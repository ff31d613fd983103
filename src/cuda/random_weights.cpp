#include "cuda/random_weights.h"

#include <cmath>

#include "core/error.h"
#include "cuda/fill.h"
#include "cuda/weight_group.h"

namespace fern::cuda {

namespace {

// A random affine weight's shape and format (no memory yet).
LinearWeight affine_shape(const std::string& name, int64_t experts, int64_t out, int64_t in, int bits) {
  LinearWeight w;
  w.name = name;
  w.kind = LinearWeight::Kind::Affine;
  w.experts = experts;
  w.out = out;
  w.in = in;
  w.bits = bits;
  w.group_size = 64;
  w.w = Tensor(nullptr, DType::U32, w.shape_of(in * bits / 32), Device::Cuda);
  w.scales = Tensor(nullptr, DType::BF16, w.shape_of(in / 64), Device::Cuda);
  w.biases = Tensor(nullptr, DType::BF16, w.shape_of(in / 64), Device::Cuda);
  return w;
}

// Its values, into memory already given to w (three seeds: codes, scales, biases).
void fill_affine(CudaBackend& be, LinearWeight& w, uint64_t& seed) {
  const float s = 1.7f / (float((1 << w.bits) - 1) * std::sqrt(float(w.in)));
  fill_random_u32(be.stream(), w.w.ptr<uint32_t>(), w.w.numel(), ++seed);
  fill_random_bf16(be.stream(), w.scales.ptr<uint16_t>(), w.scales.numel(), ++seed, 0.5f * s, 1.5f * s, true);
  fill_random_bf16(be.stream(), w.biases.ptr<uint16_t>(), w.biases.numel(), ++seed, -0.3f * s, 0.3f * s, true);
}

}  // namespace

LinearWeight random_device_affine(CudaBackend& be, const std::string& name, int64_t experts, int64_t out, int64_t in,
                                  int bits, uint64_t& seed) {
  LinearWeight w = affine_shape(name, experts, out, in, bits);
  for (Tensor* t : {&w.w, &w.scales, &w.biases}) *t = be.alloc(t->dtype, w.shape_of(t->dim(-1)));
  fill_affine(be, w, seed);
  return w;
}

namespace {

struct Builder {
  CudaBackend& be;
  uint64_t seed;

  LinearWeight affine(const std::string& name, int64_t experts, int64_t out, int64_t in, int bits) {
    return random_device_affine(be, name, experts, out, in, bits, seed);
  }
  // A layer's mixer input projections (4-bit, one width) in one region (weight_group.h), each filled with the
  // seeds that random_device_affine would give it in this order: the same values as one by one.
  std::vector<LinearWeight> affine_group(const std::vector<std::pair<std::string, int64_t>>& mats, int64_t in) {
    std::vector<LinearWeight> shapes;
    for (const auto& [name, out] : mats) shapes.push_back(affine_shape(name, 0, out, in, 4));
    std::vector<const LinearWeight*> ptrs;
    for (const LinearWeight& w : shapes) ptrs.push_back(&w);
    const GroupLayout layout = group_layout(ptrs);
    FERN_CHECK(!layout.at.empty(), "random_device_weights: input projections that cannot share a region");
    Tensor region = be.alloc(DType::U8, {int64_t(layout.bytes)});
    std::vector<LinearWeight> ws = group_views(ptrs, layout, region.ptr<char>());
    for (LinearWeight& w : ws) fill_affine(be, w, seed);
    return ws;
  }
  Tensor vec(int64_t n, float lo, float hi) {
    Tensor t = be.alloc(DType::F32, {n});
    fill_random_f32(be.stream(), t.ptr<float>(), n, ++seed, lo, hi);
    return t;
  }
};

}  // namespace

std::shared_ptr<ModelWeights> random_device_weights(CudaBackend& be, const ModelConfig& c, uint64_t seed) {
  FERN_CHECK(int(c.layer_types.size()) == c.num_hidden_layers, "random_device_weights: layer_types");
  auto mw = std::make_shared<ModelWeights>();
  mw->config = c;
  Builder b{be, seed * 7919};
  const int64_t H = c.hidden_size;
  mw->embed = b.affine("embed_tokens", 0, c.vocab_size, H, 4);
  mw->lm_head = b.affine("lm_head", 0, c.vocab_size, H, 4);
  mw->final_norm = b.vec(H, 0.8f, 1.2f);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights L;
    const std::string p = "layers." + std::to_string(l) + ".";
    L.type = c.layer_types[l];
    L.input_norm = b.vec(H, 0.8f, 1.2f);
    L.post_norm = b.vec(H, 0.8f, 1.2f);
    if (L.type == LayerType::LinearAttention) {
      const int64_t Hv = c.linear_num_value_heads;
      auto in = b.affine_group({{p + "in_proj_qkv", c.gdn_conv_dim()},
                                {p + "in_proj_z", c.gdn_value_dim()},
                                {p + "in_proj_b", Hv},
                                {p + "in_proj_a", Hv}},
                               H);
      L.gdn.in_proj_qkv = in[0];
      L.gdn.in_proj_z = in[1];
      L.gdn.in_proj_b = in[2];
      L.gdn.in_proj_a = in[3];
      L.gdn.out_proj = b.affine(p + "out_proj", 0, H, c.gdn_value_dim(), 4);
      L.gdn.conv_w = b.vec(c.gdn_conv_dim() * c.linear_conv_kernel_dim, -0.5f, 0.5f).reshape(
          {c.gdn_conv_dim(), c.linear_conv_kernel_dim});
      L.gdn.A_log = b.vec(Hv, 0.0f, 2.0f);
      L.gdn.dt_bias = b.vec(Hv, -1.5f, -0.5f);
      L.gdn.norm_w = b.vec(c.linear_value_head_dim, 0.8f, 1.2f);
    } else {
      const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
      auto in = b.affine_group({{p + "q_proj", 2 * qd}, {p + "k_proj", kvd}, {p + "v_proj", kvd}}, H);
      L.attn.q_proj = in[0];
      L.attn.k_proj = in[1];
      L.attn.v_proj = in[2];
      L.attn.o_proj = b.affine(p + "o_proj", 0, H, qd, 4);
      L.attn.q_norm = b.vec(c.head_dim, 0.8f, 1.2f);
      L.attn.k_norm = b.vec(c.head_dim, 0.8f, 1.2f);
    }
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
    L.moe.router = b.affine(p + "router", 0, E, H, 8);
    L.moe.gate = b.affine(p + "experts.gate", E, I, H, 4);
    L.moe.up = b.affine(p + "experts.up", E, I, H, 4);
    L.moe.down = b.affine(p + "experts.down", E, H, I, 4);
    L.moe.shared_gate = b.affine(p + "shared.gate", 0, Is, H, 4);
    L.moe.shared_up = b.affine(p + "shared.up", 0, Is, H, 4);
    L.moe.shared_down = b.affine(p + "shared.down", 0, H, Is, 4);
    L.moe.shared_expert_gate = b.affine(p + "shared_expert_gate", 0, 1, H, 8);
    mw->layers.push_back(std::move(L));
  }
  be.synchronize();
  return mw;
}

}  // namespace fern::cuda
