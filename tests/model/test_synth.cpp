// Synthetic checkpoints: determinism (same seed, same bytes), independence from generation order, the mlx4
// layout being quantize(hf), and the in-memory model equal to the one loaded from disk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/bf16.h"
#include "core/error.h"
#include "model/loader.h"
#include "model/synth.h"
#include "test_util.h"

namespace fern {
namespace {

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Synth, SameSeedSameBytes) {
  ModelConfig cfg = synth_preset("tiny");
  cfg.vocab_size = 4096;  // keeps the files small; every tensor kind is still there
  for (auto fmt : {CheckpointFormat::HfBf16, CheckpointFormat::Mlx4}) {
    SynthOptions o;
    o.seed = 7;
    o.format = fmt;
    const std::string a = test::temp_dir("synth-a"), b = test::temp_dir("synth-b");
    write_synth_checkpoint(cfg, o, a);
    write_synth_checkpoint(cfg, o, b);
    const std::string fa = read_file(a + "/model.safetensors"), fb = read_file(b + "/model.safetensors");
    ASSERT_GT(fa.size(), 1000000u);
    ASSERT_EQ(fa.size(), fb.size());
    EXPECT_TRUE(fa == fb) << format_name(fmt);
    o.seed = 8;
    const std::string c = test::temp_dir("synth-c");
    write_synth_checkpoint(cfg, o, c);
    EXPECT_FALSE(fa == read_file(c + "/model.safetensors")) << "a different seed must change the weights";
  }
}

TEST(Synth, LoadsInBothLayouts) {
  const ModelConfig cfg = synth_preset("tiny");
  for (auto fmt : {CheckpointFormat::HfBf16, CheckpointFormat::Mlx4}) {
    SynthOptions o;
    o.seed = 3;
    o.format = fmt;
    const std::string d = test::temp_dir("synth-load");
    write_synth_checkpoint(cfg, o, d);
    EXPECT_EQ(detect_format(d), fmt);
    auto w = load_model(d);
    ASSERT_EQ(w->layers.size(), 4u);
    EXPECT_EQ(w->embed.out, cfg.vocab_size);
    EXPECT_EQ(w->embed.quantized(), fmt == CheckpointFormat::Mlx4);
  }
}

}  // namespace
}  // namespace fern

namespace fern {
namespace {

// The bytes of every part of every streamed tensor, filled row range by row range in the given order.
std::map<std::string, std::vector<uint8_t>> stream_bytes(const ModelConfig& cfg, const SynthOptions& o, bool reverse) {
  std::map<std::string, std::vector<uint8_t>> out;
  std::vector<SynthTensor> ts;
  synth_for_each_tensor(cfg, o, [&](const SynthTensor& t) { ts.push_back(t); });
  if (reverse) std::reverse(ts.begin(), ts.end());
  for (const auto& t : ts) {
    std::vector<std::vector<uint8_t>*> bufs;
    for (const auto& p : t.parts) {
      auto& b = out[p.name];
      b.resize(p.nbytes());
      bufs.push_back(&b);
    }
    // Rows in reverse blocks of 3 (or all at once, in parallel): values depend on (seed, name, index) only.
    const int64_t step = reverse ? 3 : t.rows;
    for (int64_t r1 = t.rows; r1 > 0; r1 -= step) {
      const int64_t r0 = std::max<int64_t>(0, r1 - step);
      std::vector<uint8_t*> dst;
      for (size_t p = 0; p < t.parts.size(); ++p) dst.push_back(bufs[p]->data() + r0 * t.row_bytes(p));
      if (reverse) t.fill(r0, r1 - r0, dst.data());
      else t.fill_parallel(r0, r1 - r0, dst.data());
    }
  }
  return out;
}

TEST(Synth, IndependentOfGenerationOrder) {
  ModelConfig cfg = synth_preset("tiny");
  cfg.vocab_size = 1000;
  for (auto f : {CheckpointFormat::HfBf16, CheckpointFormat::Mlx4}) {
    SynthOptions o;
    o.seed = 42;
    o.format = f;
    const auto a = stream_bytes(cfg, o, false), b = stream_bytes(cfg, o, true);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, bytes] : a) ASSERT_TRUE(bytes == b.at(name)) << name;
    // A tensor does not depend on which other tensors exist: a 6-layer model shares layer 2 bit for bit.
    ModelConfig deeper = cfg;
    deeper.num_hidden_layers = 8;
    deeper.layer_types.insert(deeper.layer_types.end(), cfg.layer_types.begin(), cfg.layer_types.end());
    const auto c = stream_bytes(deeper, o, false);
    int shared = 0;
    for (const auto& [name, bytes] : a)
      if (name.find("layers.2.") != std::string::npos) {
        ASSERT_TRUE(bytes == c.at(name)) << name;
        ++shared;
      }
    EXPECT_GT(shared, 8);
  }
}

// The stored HF values are the generator's (synth_hf_value), and their statistics are the documented ones
// (docs/FORMATS.md): projections uniform with standard deviation 1/sqrt(fan-in), norms near 1, decays in range.
TEST(Synth, ValueScales) {
  const ModelConfig cfg = synth_preset("tiny");
  SynthOptions o;
  o.seed = 9;
  o.format = CheckpointFormat::HfBf16;
  o.logit_scale = 4.0f;
  auto w = synth_weights(cfg, o);
  auto stats = [](const LinearWeight& lw) {
    const uint16_t* p = lw.w.ptr<uint16_t>();
    const int64_t n = lw.out * lw.in;
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = bf16_to_f32(p[i]);
      s += v;
      s2 += v * v;
    }
    return std::pair<double, double>(s / n, std::sqrt(s2 / n));
  };
  const auto [m0, sd0] = stats(w->layers[0].gdn.in_proj_qkv);
  EXPECT_NEAR(m0, 0.0, 0.01);
  EXPECT_NEAR(sd0, 1.0 / std::sqrt(128.0), 0.02 / std::sqrt(128.0));
  const auto [m1, sd1] = stats(w->layers[3].attn.o_proj);
  EXPECT_NEAR(sd1, 1.0 / std::sqrt(1024.0), 0.02 / std::sqrt(1024.0));
  const auto [m2, sd2] = stats(w->lm_head);
  EXPECT_NEAR(sd2, 4.0 / std::sqrt(128.0), 0.02 * 4.0 / std::sqrt(128.0));
  const auto [m3, sd3] = stats(w->embed);
  EXPECT_NEAR(sd3, 1.0, 0.02);
  EXPECT_EQ(bf16_to_f32(w->lm_head.w.ptr<uint16_t>()[77]), synth_hf_value(cfg, o, "lm_head.weight", 77));
  for (int64_t k = 0; k < cfg.hidden_size; ++k) {
    EXPECT_GE(w->final_norm.ptr<float>()[k], 0.9f);
    EXPECT_LE(w->final_norm.ptr<float>()[k], 1.1f);
  }
  // Per-step decay exp(-exp(A_log) softplus(dt_bias)) at a = 0 lies in [exp(-16 * 0.1), exp(-1e-3)].
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < cfg.linear_num_value_heads; ++h) {
      const float A = std::exp(w->layers[l].gdn.A_log.ptr<float>()[h]);
      const float dt = std::log1p(std::exp(w->layers[l].gdn.dt_bias.ptr<float>()[h]));
      EXPECT_GE(A, 1.0f);
      EXPECT_LE(A, 16.0f);
      EXPECT_GE(dt, 0.99e-3f);
      EXPECT_LE(dt, 0.101f);
    }
}

TEST(Synth, PresetsAndErrors) {
  EXPECT_THROW(synth_preset("huge"), Error);
  const ModelConfig full = synth_preset("qwen3.6-35b-a3b");
  EXPECT_EQ(full.vocab_size, 248320);
  EXPECT_EQ(full.num_attention_layers(), 10);
  const ModelConfig small = synth_preset("small");
  // "small" is a few hundred MB in mlx4: count the bytes the stream would write.
  SynthOptions o;
  uint64_t bytes = 0;
  synth_for_each_tensor(small, o, [&](const SynthTensor& t) { bytes += t.nbytes(); });
  EXPECT_GT(bytes, 200u << 20);
  EXPECT_LT(bytes, 800u << 20);
  uint64_t full_bytes = 0;
  synth_for_each_tensor(full, o, [&](const SynthTensor& t) { full_bytes += t.nbytes(); });
  // MODEL.md 6.2: about 19.5 GB for the text model in MLX 4-bit.
  EXPECT_NEAR(full_bytes / 1e9, 19.5, 0.3);
}

}  // namespace
}  // namespace fern
