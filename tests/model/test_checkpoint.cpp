// Model directories: sharded checkpoints with model.safetensors.index.json (RELIABILITY.md 3 A, T11 and T12):
// shard names that leave the directory (.., absolute, symlinks), missing shards, tensors missing from their
// shard, tensors missing from the index, and the same tensor in two files.
// fern-test-labels: parser
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/loader.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fern {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A sharded HF micro checkpoint (shards of at most 1 MB).
std::string sharded_dir() {
  const std::string d = test::temp_dir("shards");
  SynthOptions o;
  o.seed = 5;
  o.format = CheckpointFormat::HfBf16;
  write_synth_checkpoint(test::micro_config(), o, d);
  test::write_all(d, test::read_all(d), uint64_t(1) << 20);
  return d;
}

json read_index(const std::string& d) {
  std::ifstream f(d + "/model.safetensors.index.json");
  return json::parse(f);
}
void write_index(const std::string& d, const json& j) { std::ofstream(d + "/model.safetensors.index.json") << j.dump(); }

void expect_error(const std::string& d, std::initializer_list<std::string> needles) {
  try {
    load_model(d);
    ADD_FAILURE() << "loaded; expected an error mentioning " << *needles.begin();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m;
  }
}

TEST(Checkpoint, ShardedLoadsLikeSingleFile) {
  const std::string d = sharded_dir();
  auto ck = CheckpointFiles::open(d);
  EXPECT_GT(ck->files().size(), 2u);
  auto w = load_model(d);
  EXPECT_EQ(w->layers.size(), 4u);
  const std::string one = test::temp_dir("single");
  SynthOptions o;
  o.seed = 5;
  o.format = CheckpointFormat::HfBf16;
  write_synth_checkpoint(test::micro_config(), o, one);
  auto w1 = load_model(one);
  ASSERT_EQ(w->embed.w.nbytes(), w1->embed.w.nbytes());
  EXPECT_EQ(std::memcmp(w->embed.w.data, w1->embed.w.data, w1->embed.w.nbytes()), 0);
  EXPECT_EQ(std::memcmp(w->layers[3].attn.q_norm.data, w1->layers[3].attn.q_norm.data, 4 * 256), 0);
}

TEST(Checkpoint, T11_ShardPathsStayInside) {
  const std::string d = sharded_dir();
  const json good = read_index(d);
  const std::string tensor = "model.language_model.norm.weight";
  const std::string outside = test::temp_dir("outside");
  fs::copy_file(d + "/" + good["weight_map"][tensor].get<std::string>(), outside + "/x.safetensors");
  for (const std::string bad : {"../x.safetensors", "/etc/passwd", "sub/../../x.safetensors", "", ".."}) {
    json j = good;
    j["weight_map"][tensor] = bad;
    write_index(d, j);
    expect_error(d, {"model.safetensors.index.json", tensor});
  }
  // A symlink inside the directory that points outside it.
  fs::create_symlink(outside + "/x.safetensors", d + "/link.safetensors");
  json j = good;
  j["weight_map"][tensor] = "link.safetensors";
  write_index(d, j);
  expect_error(d, {"link.safetensors", "outside the model directory", tensor});
  // A symlink that stays inside is fine.
  fs::create_symlink(d + "/" + good["weight_map"][tensor].get<std::string>(), d + "/inside.safetensors");
  j["weight_map"][tensor] = "inside.safetensors";
  write_index(d, j);
  EXPECT_NO_THROW(load_model(d));
}

TEST(Checkpoint, T12_IndexAndShardsDisagree) {
  const std::string d = sharded_dir();
  const json good = read_index(d);
  const std::string tensor = "model.language_model.layers.2.linear_attn.A_log";
  json j = good;
  j["weight_map"][tensor] = "model-00099-of-00099.safetensors";
  write_index(d, j);
  expect_error(d, {"model-00099-of-00099.safetensors", "missing shard"});
  // Listed in the index under a shard that does not hold it.
  j = good;
  const std::string holder = good["weight_map"][tensor];
  for (const auto& [n, s] : good["weight_map"].items())
    if (s != holder) {
      j["weight_map"][tensor] = s;
      break;
    }
  write_index(d, j);
  expect_error(d, {tensor, "absent from shard"});
  // A shard tensor missing from the index: ignored with a warning; a required one is then missing.
  j = good;
  j["weight_map"].erase(tensor);
  write_index(d, j);
  expect_error(d, {"required tensor", tensor});
  j = good;
  j["weight_map"] = 5;
  write_index(d, j);
  expect_error(d, {"weight_map"});
  std::ofstream(d + "/model.safetensors.index.json") << "{not json";
  expect_error(d, {"model.safetensors.index.json"});
}

TEST(Checkpoint, SameTensorInTwoFilesWithoutIndex) {
  const std::string d = sharded_dir();
  fs::remove(d + "/model.safetensors.index.json");
  EXPECT_NO_THROW(load_model(d));  // all *.safetensors of the directory
  const auto ts = test::read_all(d);
  test::RawTensors extra;
  extra["model.language_model.norm.weight"] = ts.at("model.language_model.norm.weight");
  const std::string other = test::temp_dir("dup");
  test::write_all(other, extra);
  fs::copy_file(other + "/model.safetensors", d + "/zz-extra.safetensors");
  expect_error(d, {"model.language_model.norm.weight", "also in"});
}

// Rewriting a sharded directory as a single file must not leave the old index behind (it would win).
TEST(Checkpoint, SingleFileWriteRemovesStaleIndex) {
  const std::string d = sharded_dir();
  ASSERT_TRUE(fs::exists(d + "/model.safetensors.index.json"));
  SynthOptions o;
  o.seed = 6;
  o.format = CheckpointFormat::HfBf16;
  write_synth_checkpoint(test::micro_config(), o, d);
  EXPECT_FALSE(fs::exists(d + "/model.safetensors.index.json"));
  auto w = load_model(d);
  auto fresh = synth_weights(test::micro_config(), o);
  EXPECT_EQ(std::memcmp(w->embed.w.data, fresh->embed.w.data, fresh->embed.w.nbytes()), 0);
}

TEST(Checkpoint, MissingDirectoryOrFiles) {
  expect_error("/nonexistent/fern-model", {"/nonexistent/fern-model"});
  const std::string d = test::temp_dir("empty");
  std::ofstream(d + "/config.json") << model_config_to_json(test::micro_config());
  expect_error(d, {"no model.safetensors"});
}

}  // namespace
}  // namespace fern
