// Binding both checkpoint layouts (MODEL.md 3) on micro synthetic checkpoints: every tensor bound with the
// config's shapes, norms +1 only for HF, fused experts as strided views, the per-expert and flat HF forms, tied
// embeddings, MLX weights equal to quantize(HF) bit for bit, and bad checkpoints (RELIABILITY.md 3 A, T09 and
// T13-T15) refused with the tensor named.
// fern-test-labels: parser
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "model/loader.h"
#include "quant/affine.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fern {
namespace {

namespace fs = std::filesystem;

std::string make(CheckpointFormat f, uint64_t seed = 11) {
  const std::string d = test::temp_dir(f == CheckpointFormat::Mlx4 ? "mlx" : "hf");
  SynthOptions o;
  o.seed = seed;
  o.format = f;
  write_synth_checkpoint(test::micro_config(), o, d);
  return d;
}

float bf16_at(const test::RawTensor& t, int64_t i) {
  uint16_t h;
  std::memcpy(&h, t.bytes.data() + 2 * i, 2);
  return bf16_to_f32(h);
}

void expect_error(const std::string& d, std::initializer_list<std::string> needles) {
  try {
    load_model(d);
    ADD_FAILURE() << "loaded; expected an error mentioning " << *needles.begin();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m;
  }
}

// Every LinearWeight of the model, with the (out, in, experts) the config implies.
struct Expect {
  const LinearWeight* w;
  int64_t out, in, experts;
};
std::vector<Expect> all_linears(const ModelWeights& m) {
  const ModelConfig& c = m.config;
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  std::vector<Expect> v = {{&m.embed, c.vocab_size, H, 0}, {&m.lm_head, c.vocab_size, H, 0}};
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = m.layers[i];
    if (c.is_attention_layer(i)) {
      const int64_t qd = c.num_attention_heads * c.head_dim, kvd = c.num_key_value_heads * c.head_dim;
      v.insert(v.end(), {{&l.attn.q_proj, 2 * qd, H, 0}, {&l.attn.k_proj, kvd, H, 0}, {&l.attn.v_proj, kvd, H, 0},
                         {&l.attn.o_proj, H, qd, 0}});
    } else {
      v.insert(v.end(), {{&l.gdn.in_proj_qkv, c.gdn_conv_dim(), H, 0},
                         {&l.gdn.in_proj_z, c.gdn_value_dim(), H, 0},
                         {&l.gdn.in_proj_b, c.linear_num_value_heads, H, 0},
                         {&l.gdn.in_proj_a, c.linear_num_value_heads, H, 0},
                         {&l.gdn.out_proj, H, c.gdn_value_dim(), 0}});
    }
    v.insert(v.end(), {{&l.moe.router, E, H, 0}, {&l.moe.gate, I, H, E}, {&l.moe.up, I, H, E}, {&l.moe.down, H, I, E},
                       {&l.moe.shared_gate, Is, H, 0}, {&l.moe.shared_up, Is, H, 0}, {&l.moe.shared_down, H, Is, 0},
                       {&l.moe.shared_expert_gate, 1, H, 0}});
  }
  return v;
}

// Row r of a weight (expert e) as fp32, dequantizing affine weights.
std::vector<float> row_of(const LinearWeight& lw, int64_t e, int64_t r) {
  const LinearWeight m = lw.experts ? lw.expert(e) : lw;
  std::vector<float> out(static_cast<size_t>(m.in));
  if (m.kind == LinearWeight::Kind::Dense) {
    const uint16_t* p = m.w.ptr<uint16_t>() + r * m.in;
    for (int64_t k = 0; k < m.in; ++k) out[k] = bf16_to_f32(p[k]);
  } else {
    dequantize_row(m.w.ptr<uint32_t>() + r * m.w.dim(1), m.scales.ptr<uint16_t>() + r * m.scales.dim(1),
                   m.biases.ptr<uint16_t>() + r * m.biases.dim(1), m.in, m.bits, m.group_size, out.data());
  }
  return out;
}

TEST(Loader, HfEveryTensorBound) {
  const std::string d = make(CheckpointFormat::HfBf16);
  size_t calls = 0, last = 0, total = 0;
  LoadOptions lo;
  lo.progress = [&](size_t done, size_t t) {
    EXPECT_GE(done, last);
    last = done;
    total = t;
    ++calls;
  };
  auto w = load_model(d, lo);
  EXPECT_GT(calls, 10u);
  EXPECT_EQ(last, total);
  const ModelConfig& c = w->config;
  for (const auto& x : all_linears(*w)) {
    ASSERT_EQ(x.w->kind, LinearWeight::Kind::Dense) << x.w->name;
    EXPECT_EQ(x.w->out, x.out) << x.w->name;
    EXPECT_EQ(x.w->in, x.in) << x.w->name;
    EXPECT_EQ(x.w->experts, x.experts) << x.w->name;
    EXPECT_EQ(x.w->w.dtype, DType::BF16);
  }
  const auto raw = test::read_all(d);
  const std::string L3 = "model.language_model.layers.3.", L0 = "model.language_model.layers.0.";
  // Zero-centred norms: 1 + w in fp32. The gated norm: plain.
  for (int64_t k = 0; k < c.hidden_size; ++k)
    ASSERT_EQ(w->layers[0].input_norm.ptr<float>()[k], 1.0f + bf16_at(raw.at(L0 + "input_layernorm.weight"), k));
  for (int64_t k = 0; k < c.head_dim; ++k)
    ASSERT_EQ(w->layers[3].attn.k_norm.ptr<float>()[k], 1.0f + bf16_at(raw.at(L3 + "self_attn.k_norm.weight"), k));
  for (int64_t k = 0; k < c.linear_value_head_dim; ++k)
    ASSERT_EQ(w->layers[0].gdn.norm_w.ptr<float>()[k], bf16_at(raw.at(L0 + "linear_attn.norm.weight"), k));
  EXPECT_EQ(w->final_norm.dtype, DType::F32);
  // Conv [C,1,4] -> F32 [C,4]; A_log stays the stored fp32.
  EXPECT_EQ(w->layers[0].gdn.conv_w.dim(0), c.gdn_conv_dim());
  EXPECT_EQ(w->layers[0].gdn.conv_w.dim(1), 4);
  for (int64_t k = 0; k < c.gdn_conv_dim() * 4; ++k)
    ASSERT_EQ(w->layers[0].gdn.conv_w.ptr<float>()[k], bf16_at(raw.at(L0 + "linear_attn.conv1d.weight"), k));
  EXPECT_EQ(std::memcmp(w->layers[0].gdn.A_log.data, raw.at(L0 + "linear_attn.A_log").bytes.data(), 4 * 4), 0);
  // Fused experts: gate = rows [0, I), up = rows [I, 2I) of each expert, as views into the file (no copy).
  const auto& gu = raw.at(L0 + "mlp.experts.gate_up_proj");
  const int64_t I = c.moe_intermediate_size, H = c.hidden_size;
  EXPECT_EQ(w->layers[0].moe.gate.expert_stride, 2 * I * H);
  for (int64_t e : {0, 5, 15})
    for (int64_t r : {0, 17, 63}) {
      const auto g = row_of(w->layers[0].moe.gate, e, r), u = row_of(w->layers[0].moe.up, e, r);
      for (int64_t k = 0; k < H; ++k) {
        ASSERT_EQ(g[k], bf16_at(gu, (e * 2 * I + r) * H + k));
        ASSERT_EQ(u[k], bf16_at(gu, (e * 2 * I + I + r) * H + k));
      }
    }
}

// The mlx4 checkpoint of the same seed: every weight is exactly quantize(HF weight) (same codes, scales and
// biases), router and shared-expert gate at 8 bits, norms are the stored bf16(1 + w) used as they are.
TEST(Loader, Mlx4IsQuantizeOfHf) {
  auto hf = load_model(make(CheckpointFormat::HfBf16));
  const std::string dm = make(CheckpointFormat::Mlx4);
  EXPECT_EQ(detect_format(dm), CheckpointFormat::Mlx4);
  auto mx = load_model(dm);
  const auto a = all_linears(*hf), b = all_linears(*mx);
  ASSERT_EQ(a.size(), b.size());
  int checked_rows = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const LinearWeight& q = *b[i].w;
    ASSERT_EQ(q.kind, LinearWeight::Kind::Affine) << q.name;
    auto ends = [&](const std::string& suf) {
      return q.name.size() >= suf.size() && q.name.compare(q.name.size() - suf.size(), suf.size(), suf) == 0;
    };
    const bool eight = ends(".mlp.gate") || ends(".mlp.shared_expert_gate");
    EXPECT_EQ(q.bits, eight ? 8 : 4) << q.name << " " << i;
    EXPECT_EQ(q.group_size, 64);
    EXPECT_EQ(q.out, b[i].out);
    EXPECT_EQ(q.in, b[i].in);
    EXPECT_EQ(q.experts, b[i].experts);
    const int64_t E = std::max<int64_t>(1, q.experts);
    for (int64_t e = 0; e < E; ++e) {
      const LinearWeight qe = q.experts ? q.expert(e) : q;
      for (int64_t r = 0; r < q.out; ++r) {
        const auto src = row_of(*a[i].w, e, r);
        std::vector<uint32_t> pk(static_cast<size_t>(q.in * q.bits / 32));
        std::vector<uint16_t> s(static_cast<size_t>(q.in / 64)), bb(s.size());
        quantize_row(src.data(), q.in, q.bits, 64, pk.data(), s.data(), bb.data());
        ASSERT_EQ(std::memcmp(pk.data(), qe.w.ptr<uint32_t>() + r * qe.w.dim(1), pk.size() * 4), 0) << q.name << " row " << r;
        ASSERT_EQ(std::memcmp(s.data(), qe.scales.ptr<uint16_t>() + r * s.size(), s.size() * 2), 0) << q.name;
        ASSERT_EQ(std::memcmp(bb.data(), qe.biases.ptr<uint16_t>() + r * s.size(), s.size() * 2), 0) << q.name;
        ++checked_rows;
      }
    }
  }
  EXPECT_GT(checked_rows, 10000);
  const ModelConfig& c = hf->config;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    for (int64_t k = 0; k < c.hidden_size; ++k) {
      ASSERT_EQ(mx->layers[i].input_norm.ptr<float>()[k], round_bf16(hf->layers[i].input_norm.ptr<float>()[k]));
      ASSERT_EQ(mx->layers[i].post_norm.ptr<float>()[k], round_bf16(hf->layers[i].post_norm.ptr<float>()[k]));
    }
    if (c.is_attention_layer(i)) {
      for (int64_t k = 0; k < c.head_dim; ++k)
        ASSERT_EQ(mx->layers[i].attn.q_norm.ptr<float>()[k], round_bf16(hf->layers[i].attn.q_norm.ptr<float>()[k]));
    } else {
      EXPECT_EQ(std::memcmp(mx->layers[i].gdn.conv_w.data, hf->layers[i].gdn.conv_w.data, hf->layers[i].gdn.conv_w.nbytes()), 0);
      EXPECT_EQ(std::memcmp(mx->layers[i].gdn.A_log.data, hf->layers[i].gdn.A_log.data, hf->layers[i].gdn.A_log.nbytes()), 0);
      EXPECT_EQ(std::memcmp(mx->layers[i].gdn.dt_bias.data, hf->layers[i].gdn.dt_bias.data, hf->layers[i].gdn.dt_bias.nbytes()), 0);
      EXPECT_EQ(std::memcmp(mx->layers[i].gdn.norm_w.data, hf->layers[i].gdn.norm_w.data, hf->layers[i].gdn.norm_w.nbytes()), 0);
    }
  }
}

// synth_weights() builds the same model in memory as loading what write_synth_checkpoint() wrote.
TEST(Loader, InMemorySynthEqualsLoaded) {
  for (auto f : {CheckpointFormat::HfBf16, CheckpointFormat::Mlx4}) {
    SynthOptions o;
    o.seed = 11;
    o.format = f;
    auto mem = synth_weights(test::micro_config(), o);
    auto disk = load_model(make(f));
    const auto a = all_linears(*mem), b = all_linears(*disk);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].w->w.nbytes(), b[i].w->w.nbytes());
      ASSERT_EQ(std::memcmp(a[i].w->w.data, b[i].w->w.data, a[i].w->w.nbytes()), 0) << a[i].w->name;
      ASSERT_EQ(a[i].w->quantized(), b[i].w->quantized());
      if (a[i].w->quantized()) {  // dense weights have no scales (null data)
        ASSERT_EQ(std::memcmp(a[i].w->scales.data, b[i].w->scales.data, a[i].w->scales.nbytes()), 0) << a[i].w->name;
      }
    }
    EXPECT_EQ(std::memcmp(mem->final_norm.data, disk->final_norm.data, disk->final_norm.nbytes()), 0);
  }
}

// The per-expert HF form under the flat "model." prefix binds to the same weights as the fused form.
TEST(Loader, PerExpertFlatForm) {
  const std::string d = make(CheckpointFormat::HfBf16);
  auto fused = load_model(d);
  const ModelConfig c = test::micro_config();
  auto raw = test::read_all(d);
  test::RawTensors out;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  for (auto& [name, t] : raw) {
    std::string n = name.rfind("model.language_model.", 0) == 0 ? "model." + name.substr(21) : name;
    const auto gu = n.find("mlp.experts.gate_up_proj"), dn = n.find("mlp.experts.down_proj");
    if (gu == std::string::npos && dn == std::string::npos) {
      out[n] = t;
      continue;
    }
    const std::string base = n.substr(0, gu != std::string::npos ? gu : dn) + "mlp.experts.";
    for (int64_t e = 0; e < E; ++e) {
      if (gu != std::string::npos) {
        for (int half = 0; half < 2; ++half) {
          test::RawTensor p{DType::BF16, {I, H}, {}};
          const uint8_t* src = t.bytes.data() + ((e * 2 + half) * I * H) * 2;
          p.bytes.assign(src, src + I * H * 2);
          out[base + std::to_string(e) + (half ? ".up_proj.weight" : ".gate_proj.weight")] = p;
        }
      } else {
        test::RawTensor p{DType::BF16, {H, I}, {}};
        const uint8_t* src = t.bytes.data() + e * H * I * 2;
        p.bytes.assign(src, src + H * I * 2);
        out[base + std::to_string(e) + ".down_proj.weight"] = p;
      }
    }
  }
  test::write_all(d, out);
  auto per = load_model(d);
  for (int i = 0; i < c.num_hidden_layers; ++i)
    for (int64_t e : {0, 7, 15})
      for (LinearWeight MoeWeights::*pr : {&MoeWeights::gate, &MoeWeights::up, &MoeWeights::down}) {
        const LinearWeight a = (fused->layers[i].moe.*pr).expert(e), b = (per->layers[i].moe.*pr).expert(e);
        ASSERT_EQ(std::memcmp(a.w.data, b.w.data, a.w.nbytes()), 0) << "layer " << i << " expert " << e;
      }
}

TEST(Loader, TiedEmbeddings) {
  const std::string d = make(CheckpointFormat::HfBf16);
  auto raw = test::read_all(d);
  raw.erase("lm_head.weight");
  test::write_all(d, raw);
  expect_error(d, {"lm_head.weight", "missing"});  // T13: not tied, so lm_head is required
  ModelConfig c = test::micro_config();
  c.tie_word_embeddings = true;
  std::ofstream(d + "/config.json") << model_config_to_json(c);
  auto w = load_model(d);
  EXPECT_EQ(w->lm_head.w.data, w->embed.w.data);
}

// Unaligned tensor offsets (legal in safetensors), unknown extra keys, vision and MTP tensors.
TEST(Loader, UnalignedAndExtraTensors) {
  const std::string d = make(CheckpointFormat::HfBf16);
  auto ref = load_model(d);
  auto raw = test::read_all(d);
  raw["a_pad"] = test::RawTensor{DType::U8, {3}, {1, 2, 3}};  // sorts first: every later offset is odd
  raw["model.visual.blocks.0.attn.qkv.weight"] = test::RawTensor{DType::BF16, {2, 2}, std::vector<uint8_t>(8, 1)};
  raw["mtp.fc.weight"] = test::RawTensor{DType::F32, {1}, {0, 0, 128, 63}};
  test::write_all(d, raw);
  auto w = load_model(d);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->layers[0].gdn.A_log.data) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->embed.w.data) % 2, 0u);
  EXPECT_EQ(std::memcmp(w->embed.w.data, ref->embed.w.data, ref->embed.w.nbytes()), 0);
  EXPECT_EQ(std::memcmp(w->layers[0].gdn.A_log.data, ref->layers[0].gdn.A_log.data, 16), 0);
}

TEST(Loader, T13_T14_T09_BadHfTensors) {
  const std::string d = make(CheckpointFormat::HfBf16);
  const auto good = test::read_all(d);
  const std::string L1 = "model.language_model.layers.1.", L3 = "model.language_model.layers.3.";
  auto with = [&](const std::function<void(test::RawTensors&)>& edit) {
    auto r = good;
    edit(r);
    test::write_all(d, r);
  };
  with([&](test::RawTensors& r) { r.erase(L1 + "linear_attn.in_proj_z.weight"); });
  expect_error(d, {"required tensor", L1 + "linear_attn.in_proj_z.weight"});
  with([&](test::RawTensors& r) { r.erase(L1 + "mlp.experts.gate_up_proj"); });
  expect_error(d, {L1 + "mlp.experts.gate_up_proj"});
  with([&](test::RawTensors& r) { r[L3 + "self_attn.q_proj.weight"].shape = {64, 2048}; });
  expect_error(d, {L3 + "self_attn.q_proj.weight", "shape [64, 2048]", "[2048, 64]"});
  with([&](test::RawTensors& r) {
    auto& t = r["model.language_model.embed_tokens.weight"];
    t.shape[0] = 319;
    t.bytes.resize(319 * 64 * 2);
  });
  expect_error(d, {"embed_tokens.weight", "shape"});
  with([&](test::RawTensors& r) { r[L1 + "linear_attn.out_proj.weight"].dtype = DType::F16; });
  expect_error(d, {L1 + "linear_attn.out_proj.weight", "dtype F16"});
  with([&](test::RawTensors& r) {  // an fp32 norm is fine, an I32 one is not
    auto& t = r[L1 + "input_layernorm.weight"];
    t.dtype = DType::I32;
    t.bytes.resize(t.bytes.size() * 2);
  });
  expect_error(d, {L1 + "input_layernorm.weight", "dtype I32"});
  with([&](test::RawTensors& r) { r[L1 + "linear_attn.conv1d.weight"].shape = {1024, 4, 1}; });
  expect_error(d, {L1 + "linear_attn.conv1d.weight", "[1024, 1, 4]"});
}

TEST(Loader, T09_DtypeWithoutEngineType) {
  const std::string d = make(CheckpointFormat::HfBf16);
  const std::string name = "model.language_model.layers.0.linear_attn.A_log";
  auto raw = test::read_all(d);
  raw[name] = test::RawTensor{DType::I8, {4}, {1, 2, 3, 4}};
  test::write_all(d, raw);
  expect_error(d, {name, "dtype I8"});  // a known dtype where F32/BF16 is required
  // The same tensor declared F8_E4M3 (a valid safetensors dtype with no engine type): rewrite the header.
  std::ifstream in(d + "/model.safetensors", std::ios::binary);
  std::string file(std::istreambuf_iterator<char>(in), {});
  in.close();
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string head = file.substr(8, n), data = file.substr(8 + n);
  const auto at = head.find("\"dtype\":\"I8\"");
  ASSERT_NE(at, std::string::npos);
  head.replace(at, 12, "\"dtype\":\"F8_E4M3\"");
  while (head.size() % 8) head.push_back(' ');
  n = head.size();
  std::ofstream out(d + "/model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << head << data;
  out.close();
  expect_error(d, {name, "dtype F8_E4M3"});
}

// MLX inconsistencies (T15) and missing triplet members (T13).
TEST(Loader, T15_BadMlxTensors) {
  const std::string d = make(CheckpointFormat::Mlx4);
  const auto good = test::read_all(d);
  const std::string cfg_text = [&] {
    std::ifstream f(d + "/config.json");
    return std::string(std::istreambuf_iterator<char>(f), {});
  }();
  const std::string L0 = "language_model.model.layers.0.";
  auto with = [&](const std::function<void(test::RawTensors&)>& edit) {
    auto r = good;
    edit(r);
    test::write_all(d, r);
  };
  with([&](test::RawTensors& r) { r.erase(L0 + "mlp.switch_mlp.up_proj.biases"); });
  expect_error(d, {L0 + "mlp.switch_mlp.up_proj.biases", "missing"});
  with([&](test::RawTensors& r) { r[L0 + "linear_attn.in_proj_z.weight"].shape = {512, 4}; });
  expect_error(d, {L0 + "linear_attn.in_proj_z"});
  with([&](test::RawTensors& r) {  // packed width of 3 bits: 64 * 3 / 32 = 6 words
    auto& t = r[L0 + "linear_attn.in_proj_z.weight"];
    t.shape = {512, 6};
    t.bytes.resize(512 * 6 * 4);
  });
  expect_error(d, {L0 + "linear_attn.in_proj_z", "3 bits"});
  with([&](test::RawTensors& r) {  // the router written at 4 bits while config.json says 8
    auto& t = r[L0 + "mlp.gate.weight"];
    t.shape = {16, 8};
    t.bytes.resize(16 * 8 * 4);
  });
  expect_error(d, {L0 + "mlp.gate", "4 bits but config.json says 8"});
  with([&](test::RawTensors& r) {
    auto& t = r[L0 + "mlp.gate.scales"];
    t.dtype = DType::F32;
    t.bytes.resize(t.bytes.size() * 2);
  });
  expect_error(d, {L0 + "mlp.gate.scales", "dtype F32"});
  with([&](test::RawTensors& r) { r[L0 + "linear_attn.conv1d.weight"].shape = {1024, 1, 4}; });
  expect_error(d, {L0 + "linear_attn.conv1d.weight", "[1024, 4, 1]"});
  // config.json: an override for a module the file lacks; a group size the shapes contradict.
  with([](test::RawTensors&) {});
  auto j = nlohmann::json::parse(cfg_text);
  j["quantization"]["language_model.model.layers.0.mlp.nonexistent"] = {{"bits", 8}, {"group_size", 64}};
  std::ofstream(d + "/config.json") << j.dump();
  expect_error(d, {"language_model.model.layers.0.mlp.nonexistent"});
  j = nlohmann::json::parse(cfg_text);
  j["quantization"]["group_size"] = 32;
  j.erase("quantization_config");
  for (auto& [k, v] : j["quantization"].items())
    if (v.is_object()) v["group_size"] = 32;
  std::ofstream(d + "/config.json") << j.dump();
  expect_error(d, {".scales", "shape"});
  std::ofstream(d + "/config.json") << cfg_text;
  EXPECT_NO_THROW(load_model(d));
}

}  // namespace
}  // namespace fern
