// config.json parsing (MODEL.md 1; RELIABILITY.md 3 B): both nestings, legacy rope keys, quantization overrides,
// generation_config eos ids, Qwen3-Next recognition, and one bad value per key with the key named in the error.
// fern-test-labels: parser
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/synth.h"
#include "test_util.h"

namespace fern {
namespace {

using nlohmann::json;

// The released Qwen3.5/3.6-35B-A3B text_config (MODEL.md 1.2), nested as in the official repository.
json official() {
  json t = {{"model_type", "qwen3_5_moe_text"},
            {"vocab_size", 248320},
            {"hidden_size", 2048},
            {"num_hidden_layers", 40},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 2},
            {"head_dim", 256},
            {"hidden_act", "silu"},
            {"rms_norm_eps", 1e-6},
            {"max_position_embeddings", 262144},
            {"linear_num_key_heads", 16},
            {"linear_num_value_heads", 32},
            {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128},
            {"linear_conv_kernel_dim", 4},
            {"num_experts", 256},
            {"num_experts_per_tok", 8},
            {"moe_intermediate_size", 512},
            {"shared_expert_intermediate_size", 512},
            {"full_attention_interval", 4},
            {"eos_token_id", 248044},
            {"rope_parameters",
             {{"rope_type", "default"},
              {"rope_theta", 10000000},
              {"partial_rotary_factor", 0.25},
              {"mrope_section", {11, 11, 10}},
              {"mrope_interleaved", true}}}};
  json lt = json::array();
  for (int i = 0; i < 40; ++i) lt.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  t["layer_types"] = lt;
  return {{"model_type", "qwen3_5_moe"},
          {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"tie_word_embeddings", false},
          {"vision_config", {{"model_type", "qwen3_5_moe"}, {"depth", 27}}},
          {"text_config", t}};
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "config.json"); }

TEST(Config, OfficialNested) {
  const ModelConfig c = parse(official());
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.num_attention_layers(), 10);
  EXPECT_TRUE(c.is_attention_layer(3));
  EXPECT_FALSE(c.is_attention_layer(4));
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.gdn_conv_dim(), 8192);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{248044});
  EXPECT_FALSE(c.quantization.has_value());
}

// A flat text-only export with full_attention_interval and the legacy top-level rope keys.
TEST(Config, FlatWithLegacyRope) {
  json t = official()["text_config"];
  t.erase("layer_types");
  t.erase("rope_parameters");
  t["full_attention_interval"] = 2;
  t["rope_theta"] = 5e6;
  t["partial_rotary_factor"] = 0.5;
  t["rope_scaling"] = {{"type", "default"}};
  const ModelConfig c = parse(t);
  EXPECT_EQ(c.num_attention_layers(), 20);
  EXPECT_TRUE(c.is_attention_layer(1));
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.rotary_dim(), 128);
}

TEST(Config, RopeParametersWithTypeSpelling) {
  json j = official();
  j["text_config"]["rope_parameters"] = {{"type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
  EXPECT_DOUBLE_EQ(parse(j).rope_theta, 1e6);
  j["text_config"]["rope_parameters"]["type"] = "yarn";
  try {
    parse(j);
    FAIL() << "yarn accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_parameters.type"), std::string::npos) << e.what();
  }
}

TEST(Config, QuantizationOverrides) {
  for (const char* key : {"quantization", "quantization_config"}) {
    json j = official();
    j[key] = {{"group_size", 64},
              {"bits", 4},
              {"mode", "affine"},
              {"language_model.model.layers.0.mlp.gate", {{"group_size", 64}, {"bits", 8}}},
              {"language_model.model.layers.0.mlp.shared_expert_gate", {{"group_size", 64}, {"bits", 8}}},
              {"language_model.model.layers.1.mlp.gate", false}};
    const ModelConfig c = parse(j);
    ASSERT_TRUE(c.quantization.has_value()) << key;
    EXPECT_EQ(c.quantization->defaults.bits, 4);
    EXPECT_EQ(c.quantization->for_module("language_model.model.layers.0.mlp.gate").bits, 8);
    EXPECT_EQ(c.quantization->for_module("language_model.model.layers.0.mlp.shared_expert_gate").bits, 8);
    EXPECT_EQ(c.quantization->for_module("language_model.model.layers.0.mlp.switch_mlp.up_proj").bits, 4);
    EXPECT_FALSE(c.quantization->for_module("language_model.model.layers.1.mlp.gate").enabled);
  }
}

TEST(Config, GenerationConfigEos) {
  const std::string d = test::temp_dir("cfg");
  std::ofstream(d + "/config.json") << official().dump();
  std::ofstream(d + "/generation_config.json") << json{{"eos_token_id", {248046, 248044}}}.dump();
  EXPECT_EQ(load_model_config(d).eos_token_ids, (std::vector<int32_t>{248046, 248044}));
  std::ofstream(d + "/generation_config.json") << json{{"eos_token_id", "x"}}.dump();
  EXPECT_THROW(load_model_config(d), Error);
}

TEST(Config, QwenNextRecognisedAndRejected) {
  json t = official()["text_config"];
  t["model_type"] = "qwen3_next";
  t["num_experts"] = 512;
  t["num_experts_per_tok"] = 10;
  try {
    parse(t);
    FAIL() << "qwen3_next accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Qwen3-Next"), std::string::npos) << m;
    EXPECT_NE(m.find("not supported yet"), std::string::npos) << m;
  }
}

TEST(Config, RoundTripOfWrittenConfig) {
  for (const char* preset : {"tiny", "small", "qwen3.6-35b-a3b"}) {
    ModelConfig a = synth_preset(preset);
    a.quantization = QuantConfig{};
    a.quantization->overrides["language_model.model.layers.0.mlp.gate"] = {8, 64, true};
    const ModelConfig b = parse_model_config(model_config_to_json(a), "written");
    EXPECT_EQ(b.vocab_size, a.vocab_size);
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.layer_types, a.layer_types);
    EXPECT_EQ(b.num_experts, a.num_experts);
    EXPECT_EQ(b.linear_num_value_heads, a.linear_num_value_heads);
    EXPECT_EQ(b.rotary_dim(), a.rotary_dim());
    EXPECT_EQ(b.eos_token_ids.front(), a.eos_token_ids.front());
    ASSERT_TRUE(b.quantization.has_value());
    EXPECT_EQ(b.quantization->for_module("language_model.model.layers.0.mlp.gate").bits, 8);
  }
}

// One bad value at a time; the error must name the key (with its text_config. path).
TEST(Config, EveryValidationErrorNamesItsKey) {
  struct Case {
    const char* expect;  // substring of the message
    std::function<void(json&)> edit;
  };
  auto tc = [](const char* k, json v) { return [k, v](json& j) { j["text_config"][k] = v; }; };
  auto drop = [](const char* k) { return [k](json& j) { j["text_config"].erase(k); }; };
  const std::vector<Case> cases = {
      {"text_config.hidden_size", tc("hidden_size", "2048")},
      {"text_config.hidden_size", tc("hidden_size", 2048.5)},
      {"text_config.hidden_size", tc("hidden_size", -1)},
      {"text_config.hidden_size", tc("hidden_size", 0)},
      {"text_config.hidden_size", tc("hidden_size", true)},
      {"text_config.hidden_size", tc("hidden_size", nullptr)},
      {"text_config.hidden_size", tc("hidden_size", int64_t(1) << 31)},
      {"text_config.hidden_size", drop("hidden_size")},
      {"text_config.vocab_size", tc("vocab_size", int64_t(1) << 33)},
      {"text_config.num_hidden_layers", tc("num_hidden_layers", 1000000000)},
      {"text_config.num_experts", drop("num_experts")},
      {"text_config.max_position_embeddings", tc("max_position_embeddings", int64_t(1) << 40)},
      {"text_config.num_key_value_heads", tc("num_key_value_heads", 3)},
      {"text_config.linear_num_value_heads", tc("linear_num_value_heads", 24)},
      {"text_config.num_experts_per_tok", tc("num_experts_per_tok", 300)},
      {"text_config.layer_types", tc("layer_types", json::array({"linear_attention"}))},
      {"text_config.layer_types", [](json& j) { j["text_config"]["layer_types"][5] = "sliding"; }},
      {"text_config.hidden_act", tc("hidden_act", "gelu")},
      {"text_config.norm_topk_prob", tc("norm_topk_prob", false)},
      {"text_config.head_dim", tc("head_dim", 255)},
      {"text_config.rms_norm_eps", tc("rms_norm_eps", -1)},
      {"text_config.rope_parameters.rope_type", [](json& j) { j["text_config"]["rope_parameters"]["rope_type"] = "linear"; }},
      {"text_config.rope_parameters.factor", [](json& j) { j["text_config"]["rope_parameters"]["factor"] = 4.0; }},
      {"text_config.partial_rotary_factor",
       [](json& j) { j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.3; }},
      {"rope_parameters.mrope_section", [](json& j) { j["text_config"]["rope_parameters"]["mrope_section"] = {8, 8, 8}; }},
      {"text_config.model_type", tc("model_type", "llama")},
      {"text_config.attention_bias", tc("attention_bias", true)},
      {"text_config.torch_dtype", tc("torch_dtype", "float8")},
      {"text_config.dtype", tc("dtype", 16)},
      {"quantization.bits", [](json& j) { j["quantization"] = {{"bits", 3}, {"group_size", 64}}; }},
      {"quantization.group_size", [](json& j) { j["quantization"] = {{"bits", 4}, {"group_size", 0}}; }},
      {"quantization.mode", [](json& j) { j["quantization"] = {{"bits", 4}, {"group_size", 64}, {"mode", "mxfp4"}}; }},
      {"quantization.language_model.model.layers.0.mlp.gate.bits",
       [](json& j) { j["quantization"] = {{"bits", 4}, {"language_model.model.layers.0.mlp.gate", {{"bits", 5}}}}; }},
      {"text_config", [](json& j) { j["text_config"] = 5; }},
  };
  for (const auto& c : cases) {
    json j = official();
    c.edit(j);
    try {
      parse(j);
      ADD_FAILURE() << "accepted: expected an error naming " << c.expect;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(c.expect), std::string::npos) << "message: " << m;
      EXPECT_NE(m.find("config.json"), std::string::npos) << "message: " << m;
    }
  }
}

TEST(Config, MalformedJson) {
  for (const std::string& text : std::vector<std::string>{"", "{", "[1,2]", "42", "{\"text_config\": {}}", std::string(200000, '[')}) {
    EXPECT_THROW(parse_model_config(text, "config.json"), Error) << text.substr(0, 20);
  }
}

}  // namespace
}  // namespace fern
