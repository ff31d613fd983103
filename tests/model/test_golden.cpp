// Golden test against HF transformers (fern-test-labels: golden).
//
// tools/golden/hf_golden.py ran Qwen3_5MoeForCausalLM (transformers 5.17, fp32, on the CPU) on the synthetic
// checkpoints that `fern synth --config tests/fixtures/golden/config.json --seed 7` writes, in the HF bf16 layout and
// in the MLX 4-bit layout (transformers fed the dequantized weights), and recorded the logits of every prompt
// position plus 8 greedy decode steps for three prompts (7, 33 and 100 tokens: the last crosses the 64-token Gated
// DeltaNet chunk and the conv-state boundary). This test regenerates the same checkpoints (checking their bytes
// against the hash recorded when the fixtures were made), loads them with fern's loader, runs the CPU backend
// (prefill over the prompt, then decode steps with the same tokens) and compares.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cpu/cpu_backend.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/loader.h"
#include "model/synth.h"
#include "test_util.h"

namespace fern {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// 64-bit FNV-1a over little-endian 8-byte words, then the tail bytes (same as the script that recorded it).
std::string fnv1a64_words(const std::string& data) {
  uint64_t h = 0xcbf29ce484222325ull;
  const size_t n = data.size() / 8;
  for (size_t i = 0; i < n; ++i) {
    uint64_t w;
    std::memcpy(&w, data.data() + 8 * i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (size_t i = n * 8; i < data.size(); ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

struct Comparison {
  double max_abs = 0;
  int64_t rows = 0, top1_agree = 0;
};

void compare_rows(const float* got, const float* ref, int64_t rows, int64_t V, Comparison& c) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got + r * V;
    const float* e = ref + r * V;
    int64_t ag = 0, ae = 0;
    for (int64_t j = 0; j < V; ++j) {
      c.max_abs = std::max(c.max_abs, std::fabs(double(g[j]) - double(e[j])));
      if (g[j] > g[ag]) ag = j;
      if (e[j] > e[ae]) ae = j;
    }
    c.top1_agree += (ag == ae);
    c.rows += 1;
  }
}

void run_golden(const std::string& fmt_name, CheckpointFormat fmt) {
  const std::string dir = test::temp_dir("golden-" + fmt_name);
  const nlohmann::json ck = nlohmann::json::parse(read_file(test::source_path("tests/fixtures/golden/checkpoints.json")));
  const std::string cfg_path = test::source_path(ck["config"].get<std::string>());
  ModelConfig cfg = parse_model_config(read_file(cfg_path), cfg_path);
  SynthOptions so;
  so.seed = ck["seed"].get<uint64_t>();
  so.logit_scale = ck["logit_scale"].get<float>();
  so.format = fmt;
  write_synth_checkpoint(cfg, so, dir);
  // The reference was computed on these exact bytes; if the generator changed, the fixtures must be remade
  // (tools/golden/README.md) rather than compared against different weights.
  ASSERT_EQ(fnv1a64_words(read_file(dir + "/model.safetensors")), ck[fmt_name].get<std::string>())
      << "synthetic checkpoint bytes changed since the golden fixtures were made";

  auto w = load_model(dir);
  auto be = make_cpu_backend();
  const int64_t V = w->config.vocab_size;
  const nlohmann::json meta =
      nlohmann::json::parse(read_file(test::source_path("tests/fixtures/golden/golden_" + fmt_name + ".json")));
  const std::string blob = read_file(test::source_path("tests/fixtures/golden/golden_" + fmt_name + ".f32"));
  const float* ref = reinterpret_cast<const float*>(blob.data());
  ASSERT_EQ(meta["vocab_size"].get<int64_t>(), V);

  Comparison c;
  for (const auto& cs : meta["cases"]) {
    std::vector<int32_t> prompt = cs["prompt"].get<std::vector<int32_t>>();
    std::vector<int32_t> gen = cs["generated"].get<std::vector<int32_t>>();
    const int64_t off = cs["row_offset"].get<int64_t>();
    const int64_t T = static_cast<int64_t>(prompt.size());
    ASSERT_LE(size_t((off + cs["rows"].get<int64_t>()) * V * 4), blob.size());
    auto st = be->new_state(w->config, T + static_cast<int64_t>(gen.size()) + 1);
    be->reset_state(*st);
    std::vector<float> logits(static_cast<size_t>(T * V));
    {
      be->begin_forward();
      ForwardOptions fo;
      fo.all_logits = true;
      forward(*be, *w, *st, Tensor(prompt.data(), DType::I32, {T}), Tensor(logits.data(), DType::F32, {T, V}), fo);
    }
    compare_rows(logits.data(), ref + off * V, T, V, c);
    for (size_t i = 0; i < gen.size(); ++i) {
      be->begin_forward();
      int32_t id = gen[i];
      std::vector<float> row(static_cast<size_t>(V));
      forward(*be, *w, *st, Tensor(&id, DType::I32, {1}), Tensor(row.data(), DType::F32, {1, V}));
      compare_rows(row.data(), ref + (off + T + int64_t(i)) * V, 1, V, c);
    }
  }
  std::printf("[golden %s] %lld rows, top-1 agreement %lld/%lld, max |logit diff| %.3g\n", fmt_name.c_str(),
              static_cast<long long>(c.rows), static_cast<long long>(c.top1_agree), static_cast<long long>(c.rows),
              c.max_abs);
  EXPECT_EQ(c.top1_agree, c.rows);
  // The bound. Both sides compute in fp32 on identical weights; what remains is summation order
  // (measured 2026-11-30: max 4.1e-6 for the HF layout and 5.3e-6 for MLX 4-bit, on logits of std 1.0).
  EXPECT_LE(c.max_abs, 1e-3);
}

TEST(Golden, HfLayoutMatchesTransformers) { run_golden("hf", CheckpointFormat::HfBf16); }
TEST(Golden, Mlx4LayoutMatchesTransformersOnDequantizedWeights) { run_golden("mlx4", CheckpointFormat::Mlx4); }

}  // namespace
}  // namespace fern
