// `fern quantize` (quant/quantize_checkpoint.h): HF -> mlx4 -> load -> dequantize round trip within the
// algorithm's bound, byte equality with the synthetic mlx4 checkpoint of the same weights, the per-expert input
// form, copied side files, and refusal of already-quantized or malformed inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "model/loader.h"
#include "quant/affine.h"
#include "quant/quantize_checkpoint.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fern {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string synth_dir(CheckpointFormat f, uint64_t seed) {
  const std::string d = test::temp_dir("qc");
  SynthOptions o;
  o.seed = seed;
  o.format = f;
  write_synth_checkpoint(test::micro_config(), o, d);
  return d;
}

// Every weight of the quantized checkpoint, dequantized, is within the bound of affine.h of the HF weight:
// |err| <= |s|/2 inside the code range, <= |s| at codes 0 and N (the far extreme can clip because |s| may be
// up to a factor N/(N+1) below (max-min)/N), plus 2^-9 (N|s| + |bias|) from storing s and bias in bf16.
TEST(QuantizeCheckpoint, RoundTripWithinBound) {
  const std::string hf_dir = synth_dir(CheckpointFormat::HfBf16, 21);
  const std::string out = test::temp_dir("qc-out");
  std::ofstream(hf_dir + "/tokenizer.json") << "{}";
  std::ofstream(hf_dir + "/chat_template.jinja") << "{{ messages }}";
  uint64_t last = 0, total = 0;
  QuantizeOptions qo;
  qo.progress = [&](uint64_t d, uint64_t t) {
    EXPECT_GE(d, last);
    last = d;
    total = t;
  };
  quantize_checkpoint(hf_dir, out, qo);
  EXPECT_EQ(last, total);
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(out + "/chat_template.jinja"));
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  const auto j = nlohmann::json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(j["quantization"], j["quantization_config"]);
  EXPECT_EQ(j["quantization"]["bits"], 4);
  EXPECT_EQ(j["quantization"]["language_model.model.layers.3.mlp.shared_expert_gate"]["bits"], 8);
  EXPECT_EQ(j["text_config"]["hidden_size"], 64);  // the rest of config.json is kept

  auto hf = load_model(hf_dir);
  auto q = load_model(out);
  ASSERT_EQ(detect_format(out), CheckpointFormat::Mlx4);
  auto check = [](const LinearWeight& a, const LinearWeight& b) {
    ASSERT_TRUE(b.quantized()) << b.name;
    const int N = (1 << b.bits) - 1;
    double num = 0, den = 0;
    for (int64_t e = 0; e < std::max<int64_t>(1, a.experts); ++e) {
      const LinearWeight ae = a.experts ? a.expert(e) : a, be = b.experts ? b.expert(e) : b;
      std::vector<float> deq(static_cast<size_t>(b.in));
      for (int64_t r = 0; r < b.out; ++r) {
        const uint32_t* pk = be.w.ptr<uint32_t>() + r * be.w.dim(1);
        const uint16_t* s = be.scales.ptr<uint16_t>() + r * be.scales.dim(1);
        const uint16_t* bi = be.biases.ptr<uint16_t>() + r * be.biases.dim(1);
        dequantize_row(pk, s, bi, b.in, b.bits, b.group_size, deq.data());
        const uint16_t* src = ae.w.ptr<uint16_t>() + r * a.in;
        for (int64_t k = 0; k < b.in; ++k) {
          const float w = bf16_to_f32(src[k]);
          const float sc = std::fabs(bf16_to_f32(s[k / b.group_size])), bb = std::fabs(bf16_to_f32(bi[k / b.group_size]));
          const uint32_t code = affine_code(pk, k, b.bits);
          const float bound = (code == 0 || code == static_cast<uint32_t>(N) ? 1.0f : 0.5f) * sc * 1.001f +
                              std::ldexp(1.0f, -9) * (N * sc + bb);
          ASSERT_LE(std::fabs(deq[k] - w), bound) << b.name << " e " << e << " r " << r << " k " << k;
          num += (deq[k] - w) * (deq[k] - w);
          den += double(w) * w;
        }
      }
    }
    // Uniform weights: 4-bit rounding noise s^2/12 with s = 2a/15 against variance a^2/3 gives 4/900 = 4.4e-3;
    // measured 4.0e-3..4.6e-3 at 4 bits and 1.5e-5..2.9e-5 at 8 bits (1x36 shared gates); 2x margin.
    EXPECT_LT(num / den, b.bits == 4 ? 9.2e-3 : 6e-5) << b.name;
  };
  check(hf->embed, q->embed);
  check(hf->lm_head, q->lm_head);
  for (int i = 0; i < 4; ++i) {
    const auto &x = hf->layers[i], &y = q->layers[i];
    check(x.moe.router, y.moe.router);
    check(x.moe.gate, y.moe.gate);
    check(x.moe.up, y.moe.up);
    check(x.moe.down, y.moe.down);
    check(x.moe.shared_expert_gate, y.moe.shared_expert_gate);
    check(x.moe.shared_down, y.moe.shared_down);
    if (i == 3) {
      check(x.attn.q_proj, y.attn.q_proj);
      check(x.attn.o_proj, y.attn.o_proj);
    } else {
      check(x.gdn.in_proj_qkv, y.gdn.in_proj_qkv);
      check(x.gdn.in_proj_a, y.gdn.in_proj_a);
      check(x.gdn.out_proj, y.gdn.out_proj);
    }
    // Norms: the +1 moves into the stored bf16 weight.
    for (int64_t k = 0; k < 64; ++k) ASSERT_EQ(y.input_norm.ptr<float>()[k], round_bf16(x.input_norm.ptr<float>()[k]));
  }
}

// The synthetic mlx4 checkpoint is, byte for byte, the quantization of the synthetic HF one (same seed).
TEST(QuantizeCheckpoint, EqualsSynthMlx4) {
  const std::string hf_dir = synth_dir(CheckpointFormat::HfBf16, 33), mlx_dir = synth_dir(CheckpointFormat::Mlx4, 33);
  const std::string out = test::temp_dir("qc-eq");
  quantize_checkpoint(hf_dir, out);
  EXPECT_TRUE(read_file(out + "/model.safetensors") == read_file(mlx_dir + "/model.safetensors"));
  // From the per-expert, flat-prefix form of the same weights (fp32 norms: cast to bf16 first, as mlx-lm does).
  auto raw = test::read_all(hf_dir);
  test::RawTensors alt;
  const ModelConfig c = test::micro_config();
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  for (auto& [name, t] : raw) {
    const std::string n = name.rfind("model.language_model.", 0) == 0 ? "model." + name.substr(21) : name;
    const auto gu = n.find("gate_up_proj"), dn = n.find("experts.down_proj");
    if (gu != std::string::npos || dn != std::string::npos) {
      const std::string base = n.substr(0, n.find("experts.") + 8);
      for (int64_t e = 0; e < E; ++e)
        for (int part = 0; part < (gu != std::string::npos ? 2 : 1); ++part) {
          test::RawTensor p{DType::BF16, gu != std::string::npos ? std::vector<int64_t>{I, H} : std::vector<int64_t>{H, I}, {}};
          const size_t bytes = static_cast<size_t>(I * H * 2);
          const uint8_t* src = t.bytes.data() + (gu != std::string::npos ? (2 * e + part) : e) * bytes;
          p.bytes.assign(src, src + bytes);
          const char* proj = gu == std::string::npos ? "down_proj" : part ? "up_proj" : "gate_proj";
          alt[base + std::to_string(e) + "." + proj + ".weight"] = p;
        }
      continue;
    }
    if (n.find("norm.weight") != std::string::npos && t.dtype == DType::BF16) {
      test::RawTensor f{DType::F32, t.shape, std::vector<uint8_t>(t.bytes.size() * 2)};
      for (size_t k = 0; k < t.bytes.size() / 2; ++k) {
        uint16_t h;
        std::memcpy(&h, t.bytes.data() + 2 * k, 2);
        const float v = bf16_to_f32(h);
        std::memcpy(f.bytes.data() + 4 * k, &v, 4);
      }
      alt[n] = f;
      continue;
    }
    alt[n] = t;
  }
  test::write_all(hf_dir, alt, uint64_t(1) << 20);  // sharded, too
  const std::string out2 = test::temp_dir("qc-eq2");
  quantize_checkpoint(hf_dir, out2);
  EXPECT_TRUE(read_file(out2 + "/model.safetensors") == read_file(mlx_dir + "/model.safetensors"));
}

TEST(QuantizeCheckpoint, RefusesBadInput) {
  const std::string mlx_dir = synth_dir(CheckpointFormat::Mlx4, 1);
  try {
    quantize_checkpoint(mlx_dir, test::temp_dir("qc-bad"));
    ADD_FAILURE() << "quantized an MLX checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already quantized"), std::string::npos) << e.what();
  }
  const std::string hf_dir = synth_dir(CheckpointFormat::HfBf16, 1);
  auto raw = test::read_all(hf_dir);
  raw.erase("model.language_model.layers.2.mlp.experts.down_proj");
  test::write_all(hf_dir, raw);
  try {
    quantize_checkpoint(hf_dir, test::temp_dir("qc-bad2"));
    ADD_FAILURE() << "quantized a checkpoint with a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2.mlp.experts"), std::string::npos) << e.what();
  }
  raw = test::read_all(hf_dir);
  QuantizeOptions qo;
  qo.bits = 3;
  EXPECT_THROW(quantize_checkpoint(hf_dir, test::temp_dir("qc-bad3"), qo), Error);
}

}  // namespace
}  // namespace fern
