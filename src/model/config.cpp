// config.json parsing and validation (MODEL.md section 1; RELIABILITY.md section 3 B).
// Tested by tests/model/test_config.cpp.
#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "model/json_fields.h"

namespace fern {
namespace {

using nlohmann::json;

// Bounds that no model of this family comes near but that keep every derived size far from overflow.
constexpr int64_t kMaxVocab = int64_t(1) << 22;
constexpr int64_t kMaxHidden = 65536;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxIntermediate = int64_t(1) << 20;
constexpr int64_t kMaxPositions = int64_t(1) << 24;
constexpr size_t kMaxConfigBytes = size_t(16) << 20;

std::string read_text_file(const std::string& path, size_t cap) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  f.seekg(0, std::ios::end);
  auto size = f.tellg();
  if (size < 0) fail("{}: cannot read", path);
  if (static_cast<size_t>(size) > cap) fail("{}: file of {} bytes is larger than the {} byte limit", path,
                                            static_cast<size_t>(size), cap);
  f.seekg(0);
  std::string s(static_cast<size_t>(size), '\0');
  f.read(s.data(), size);
  if (!f) fail("{}: read error", path);
  return s;
}

int checked_int(int64_t v) { return static_cast<int>(v); }

// Adds a*b to total with overflow checks (sizes in elements).
void add_product(int64_t& total, std::initializer_list<int64_t> factors, const std::string& source) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(p, f, &p)) fail("{}: model size overflows 64 bits", source);
  }
  if (__builtin_add_overflow(total, p, &total)) fail("{}: model size overflows 64 bits", source);
}

void parse_rope_type(const JsonFields& f, const char* key) {
  const std::string t = f.get_string(key, "default");
  if (t != "default" && t != "mrope")
    f.bad(key, "unsupported rope scaling type \"" + t + "\" (only default RoPE is implemented)");
}

void parse_rope(const json& tc, const JsonFields& tf, ModelConfig& c) {
  c.rope_theta = tf.get_double("rope_theta", 1.0, 1e12, c.rope_theta);
  c.partial_rotary_factor = tf.get_double("partial_rotary_factor", 1e-6, 1.0, c.partial_rotary_factor);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!tf.has(key)) continue;
    const json& rp = tc.at(key);
    if (!rp.is_object()) tf.bad(key, "must be an object, got " + json_brief(rp));
    JsonFields rf{rp, tf.source, tf.path + key + "."};
    if (rf.has("rope_type")) parse_rope_type(rf, "rope_type");
    else parse_rope_type(rf, "type");
    if (rf.has("factor")) {
      double factor = rf.get_double("factor", -1e9, 1e9, 1.0);
      if (factor != 1.0) rf.bad("factor", fmt::format("{} is not supported (no RoPE scaling is implemented)", factor));
    }
    c.rope_theta = rf.get_double("rope_theta", 1.0, 1e12, c.rope_theta);
    c.partial_rotary_factor = rf.get_double("partial_rotary_factor", 1e-6, 1.0, c.partial_rotary_factor);
  }
  const double rot = c.head_dim * c.partial_rotary_factor;
  if (rot != static_cast<double>(static_cast<int64_t>(rot)) || static_cast<int64_t>(rot) % 2 != 0 || rot < 2)
    tf.bad("partial_rotary_factor", fmt::format("{} x head_dim {} = {} is not a positive even integer",
                                                c.partial_rotary_factor, c.head_dim, rot));
  // mrope_section splits the rotary frequencies among T/H/W; for text all three positions are equal, so only
  // its total matters.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!tf.has(key) || !tc.at(key).contains("mrope_section")) continue;
    const json& ms = tc.at(key).at("mrope_section");
    std::string where = std::string(key) + ".mrope_section";
    if (!ms.is_array() || ms.size() > 8) tf.bad(where.c_str(), "must be a short list of integers");
    int64_t sum = 0;
    for (const auto& v : ms) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxHeadDim)
        tf.bad(where.c_str(), "must hold non-negative integers, got " + json_brief(v));
      sum += v.get<int64_t>();
    }
    if (sum != c.rotary_dim() / 2)
      tf.bad(where.c_str(), fmt::format("sums to {}, expected rotary_dim/2 = {}", sum, c.rotary_dim() / 2));
  }
}

void parse_layer_types(const json& tc, const JsonFields& tf, ModelConfig& c) {
  c.layer_types.clear();
  if (tf.has("layer_types")) {
    const json& lt = tc.at("layer_types");
    if (!lt.is_array()) tf.bad("layer_types", "must be a list of strings");
    if (static_cast<int64_t>(lt.size()) != c.num_hidden_layers)
      tf.bad("layer_types", fmt::format("has {} entries, num_hidden_layers is {}", lt.size(), c.num_hidden_layers));
    for (size_t i = 0; i < lt.size(); ++i) {
      const json& v = lt[i];
      if (v == "linear_attention") c.layer_types.push_back(LayerType::LinearAttention);
      else if (v == "full_attention") c.layer_types.push_back(LayerType::FullAttention);
      else tf.bad("layer_types", fmt::format("entry {} is {}, expected \"linear_attention\" or \"full_attention\"",
                                             i, json_brief(v)));
    }
  } else {
    const int64_t interval = tf.get_int("full_attention_interval", 1, kMaxLayers, 4);
    for (int i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  }
}

std::vector<int32_t> parse_eos_value(const json& v, const JsonFields& f, const char* key) {
  std::vector<int32_t> ids;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= kMaxVocab)
      f.bad(key, "must be a token id or a list of token ids, got " + json_brief(x));
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  };
  if (v.is_array()) {
    if (v.size() > 64) f.bad(key, "lists more than 64 ids");
    for (const auto& x : v) one(x);
  } else if (!v.is_null()) {
    one(v);
  }
  return ids;
}

QuantParams parse_quant_params(const json& q, const JsonFields& f, const QuantParams& dflt) {
  QuantParams p = dflt;
  p.enabled = true;
  p.bits = static_cast<int>(f.get_int("bits", 1, 64, dflt.bits));
  if (p.bits != 4 && p.bits != 8) f.bad("bits", fmt::format("{} is not supported (4 or 8 bits only)", p.bits));
  p.group_size = static_cast<int>(f.get_int("group_size", 1, 1 << 20, dflt.group_size));
  if (p.group_size != 32 && p.group_size != 64 && p.group_size != 128)
    f.bad("group_size", fmt::format("{} is not supported (32, 64 or 128)", p.group_size));
  const std::string mode = f.get_string("mode", "affine");
  if (mode != "affine") f.bad("mode", "\"" + mode + "\" is not supported (affine only)");
  return p;
}

QuantConfig parse_quantization(const json& q, const std::string& source, const std::string& key) {
  if (!q.is_object()) fail("{}: key {}: must be an object, got {}", source, key, json_brief(q));
  JsonFields f{q, source, key + "."};
  QuantConfig qc;
  qc.defaults = parse_quant_params(q, f, QuantParams{});
  for (const auto& [name, v] : q.items()) {
    if (name == "bits" || name == "group_size" || name == "mode") continue;
    if (v.is_object()) {
      JsonFields of{v, source, key + "." + name + "."};
      qc.overrides[name] = parse_quant_params(v, of, qc.defaults);
    } else if (v.is_boolean()) {
      QuantParams p = qc.defaults;
      p.enabled = v.get<bool>();
      qc.overrides[name] = p;
    }
    // Other keys (e.g. "quant_method") carry no information for affine weights.
  }
  return qc;
}

}  // namespace

QuantParams QuantConfig::for_module(const std::string& module_path) const {
  auto it = overrides.find(module_path);
  return it == overrides.end() ? defaults : it->second;
}

int ModelConfig::num_attention_layers() const {
  int n = 0;
  for (auto t : layer_types) n += t == LayerType::FullAttention;
  return n;
}

void validate_model_config(const ModelConfig& c, const std::string& source) {
  auto need = [&](bool ok, const char* key, const std::string& why) {
    if (!ok) fail("{}: key {}: {}", source, key, why);
  };
  need(c.vocab_size > 0 && c.vocab_size <= kMaxVocab, "vocab_size", "out of range");
  need(c.hidden_size > 0 && c.hidden_size <= kMaxHidden, "hidden_size", "out of range");
  need(c.num_hidden_layers > 0 && c.num_hidden_layers <= kMaxLayers, "num_hidden_layers", "out of range");
  need(static_cast<int64_t>(c.layer_types.size()) == c.num_hidden_layers, "layer_types",
       "does not have num_hidden_layers entries");
  need(c.num_attention_heads > 0 && c.num_attention_heads <= kMaxHeads, "num_attention_heads", "out of range");
  need(c.num_key_value_heads > 0 && c.num_key_value_heads <= c.num_attention_heads, "num_key_value_heads",
       "must be in [1, num_attention_heads]");
  need(c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads",
       fmt::format("{} does not divide num_attention_heads {}", c.num_key_value_heads, c.num_attention_heads));
  need(c.head_dim > 0 && c.head_dim <= kMaxHeadDim && c.head_dim % 2 == 0, "head_dim", "must be even, 2..1024");
  need(c.linear_num_key_heads > 0 && c.linear_num_key_heads <= kMaxHeads, "linear_num_key_heads", "out of range");
  need(c.linear_num_value_heads > 0 && c.linear_num_value_heads <= kMaxHeads &&
           c.linear_num_value_heads % c.linear_num_key_heads == 0,
       "linear_num_value_heads", "must be a multiple of linear_num_key_heads");
  need(c.linear_key_head_dim > 0 && c.linear_key_head_dim <= kMaxHeadDim, "linear_key_head_dim", "out of range");
  need(c.linear_value_head_dim > 0 && c.linear_value_head_dim <= kMaxHeadDim, "linear_value_head_dim",
       "out of range");
  need(c.linear_conv_kernel_dim >= 1 && c.linear_conv_kernel_dim <= 16, "linear_conv_kernel_dim", "must be 1..16");
  need(c.num_experts > 0 && c.num_experts <= kMaxExperts, "num_experts", "out of range");
  need(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, "num_experts_per_tok",
       "must be in [1, num_experts]");
  need(c.moe_intermediate_size > 0 && c.moe_intermediate_size <= kMaxIntermediate, "moe_intermediate_size",
       "out of range");
  need(c.shared_expert_intermediate_size > 0 && c.shared_expert_intermediate_size <= kMaxIntermediate,
       "shared_expert_intermediate_size", "out of range");
  need(c.max_position_embeddings > 0 && c.max_position_embeddings <= kMaxPositions, "max_position_embeddings",
       "out of range");
  need(c.rms_norm_eps > 0 && c.rms_norm_eps < 1, "rms_norm_eps", "must be in (0, 1)");
  need(c.rotary_dim() >= 2 && c.rotary_dim() <= c.head_dim && c.rotary_dim() % 2 == 0, "partial_rotary_factor",
       "rotary dims must be even and at most head_dim");
  // Whole-model element count in 64 bits: catches products that would wrap in a narrower type.
  int64_t total = 0;
  const int64_t H = c.hidden_size;
  add_product(total, {2, c.vocab_size, H}, source);
  add_product(total, {c.num_hidden_layers, c.num_experts, 3, c.moe_intermediate_size, H}, source);
  add_product(total, {c.num_hidden_layers, 3, c.shared_expert_intermediate_size, H}, source);
  add_product(total, {c.num_hidden_layers, 2 * c.num_attention_heads + 2 * c.num_key_value_heads, c.head_dim, H},
              source);
  add_product(total, {c.num_hidden_layers, c.gdn_conv_dim() + 2 * c.gdn_value_dim(), H}, source);
  need(total < (int64_t(1) << 42), "hidden_size", fmt::format("model of {} parameters is implausibly large", total));
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  if (json_text.size() > kMaxConfigBytes) fail("{}: larger than {} bytes", source, kMaxConfigBytes);
  const json top = parse_json_bounded(json_text, source);
  if (!top.is_object()) fail("{}: must be a JSON object", source);
  JsonFields topf{top, source, ""};

  const std::string top_type = topf.get_string("model_type", "");
  const bool nested = topf.has("text_config");
  if (nested && !top.at("text_config").is_object()) topf.bad("text_config", "must be an object");
  const json& tc = nested ? top.at("text_config") : top;
  JsonFields tf{tc, source, nested ? "text_config." : ""};

  ModelConfig c;
  c.model_type = tf.get_string("model_type", top_type);
  if (c.model_type == "qwen3_next" || top_type == "qwen3_next")
    fail("{}: key model_type: \"qwen3_next\" (Qwen3-Next-80B-A3B) is recognised but not supported yet: its fused "
         "in_proj_qkvz/in_proj_ba projections and per-expert tensors need a converter",
         source);
  if (c.model_type != "qwen3_5_moe" && c.model_type != "qwen3_5_moe_text")
    fail("{}: key {}model_type: \"{}\" is not supported (expected qwen3_5_moe or qwen3_5_moe_text)", source,
         nested ? "text_config." : "", c.model_type);

  for (const char* key : {"dtype", "torch_dtype"}) {
    const std::string dt = tf.get_string(key, "bfloat16");
    if (dt != "bfloat16" && dt != "float16" && dt != "float32")
      tf.bad(key, "\"" + dt + "\" is not a checkpoint dtype (bfloat16, float16 or float32)");
  }
  const std::string act = tf.get_string("hidden_act", "silu");
  if (act != "silu") tf.bad("hidden_act", "\"" + act + "\" is not supported (silu only)");
  if (tf.get_bool("attention_bias", false)) tf.bad("attention_bias", "true is not supported (no biases)");
  if (tf.has("mlp_only_layers") && !(tc.at("mlp_only_layers").is_array() && tc.at("mlp_only_layers").empty()))
    tf.bad("mlp_only_layers", "dense MLP layers are not supported");

  c.vocab_size = tf.get_int("vocab_size", 1, kMaxVocab);
  c.hidden_size = tf.get_int("hidden_size", 1, kMaxHidden);
  c.num_hidden_layers = checked_int(tf.get_int("num_hidden_layers", 1, kMaxLayers));
  c.num_attention_heads = checked_int(tf.get_int("num_attention_heads", 1, kMaxHeads));
  c.num_key_value_heads = checked_int(tf.get_int("num_key_value_heads", 1, kMaxHeads));
  c.head_dim = checked_int(tf.get_int("head_dim", 2, kMaxHeadDim, 256));
  c.max_position_embeddings = tf.get_int("max_position_embeddings", 1, kMaxPositions, 262144);
  c.linear_num_key_heads = checked_int(tf.get_int("linear_num_key_heads", 1, kMaxHeads, 16));
  c.linear_num_value_heads = checked_int(tf.get_int("linear_num_value_heads", 1, kMaxHeads, 32));
  c.linear_key_head_dim = checked_int(tf.get_int("linear_key_head_dim", 1, kMaxHeadDim, 128));
  c.linear_value_head_dim = checked_int(tf.get_int("linear_value_head_dim", 1, kMaxHeadDim, 128));
  c.linear_conv_kernel_dim = checked_int(tf.get_int("linear_conv_kernel_dim", 1, 16, 4));
  c.num_experts = checked_int(tf.get_int("num_experts", 1, kMaxExperts));
  c.num_experts_per_tok = checked_int(tf.get_int("num_experts_per_tok", 1, kMaxExperts));
  c.moe_intermediate_size = checked_int(tf.get_int("moe_intermediate_size", 1, kMaxIntermediate));
  c.shared_expert_intermediate_size =
      checked_int(tf.get_int("shared_expert_intermediate_size", 1, kMaxIntermediate, 512));
  c.norm_topk_prob = tf.get_bool("norm_topk_prob", true);
  if (!c.norm_topk_prob) tf.bad("norm_topk_prob", "false is not supported (Qwen3.5 always renormalises)");
  c.rms_norm_eps = tf.get_double("rms_norm_eps", 1e-12, 0.5, 1e-6);
  c.tie_word_embeddings = topf.get_bool("tie_word_embeddings", tf.get_bool("tie_word_embeddings", false));

  if (c.num_attention_heads % c.num_key_value_heads != 0)
    tf.bad("num_key_value_heads", fmt::format("{} does not divide num_attention_heads {}", c.num_key_value_heads,
                                              c.num_attention_heads));
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    tf.bad("linear_num_value_heads", fmt::format("{} is not a multiple of linear_num_key_heads {}",
                                                 c.linear_num_value_heads, c.linear_num_key_heads));
  if (c.num_experts_per_tok > c.num_experts)
    tf.bad("num_experts_per_tok", fmt::format("{} is more than num_experts {}", c.num_experts_per_tok,
                                              c.num_experts));
  if (c.head_dim % 2 != 0) tf.bad("head_dim", fmt::format("{} is odd", c.head_dim));

  parse_rope(tc, tf, c);
  parse_layer_types(tc, tf, c);

  if (tf.has("eos_token_id")) c.eos_token_ids = parse_eos_value(tc.at("eos_token_id"), tf, "eos_token_id");
  else if (nested && topf.has("eos_token_id"))
    c.eos_token_ids = parse_eos_value(top.at("eos_token_id"), topf, "eos_token_id");

  // mlx-lm writes the same object under both keys; "quantization" is read first.
  for (const char* key : {"quantization", "quantization_config"}) {
    if (topf.has(key)) {
      c.quantization = parse_quantization(top.at(key), source, key);
      break;
    }
  }
  validate_model_config(c, source);
  return c;
}

std::vector<int32_t> parse_generation_eos(const std::string& json_text, const std::string& source) {
  if (json_text.size() > kMaxConfigBytes) fail("{}: larger than {} bytes", source, kMaxConfigBytes);
  const json j = parse_json_bounded(json_text, source);
  if (!j.is_object()) fail("{}: must be a JSON object", source);
  JsonFields f{j, source, ""};
  if (!f.has("eos_token_id")) return {};
  return parse_eos_value(j.at("eos_token_id"), f, "eos_token_id");
}

ModelConfig load_model_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(model_dir) / "config.json").string();
  ModelConfig c = parse_model_config(read_text_file(path, kMaxConfigBytes), path);
  const fs::path gen = fs::path(model_dir) / "generation_config.json";
  std::error_code ec;
  if (fs::exists(gen, ec)) {
    auto ids = parse_generation_eos(read_text_file(gen.string(), kMaxConfigBytes), gen.string());
    if (!ids.empty()) c.eos_token_ids = ids;
  }
  for (int32_t id : c.eos_token_ids)
    if (id >= c.vocab_size) fail("{}: eos token id {} is not below vocab_size {}", path, id, c.vocab_size);
  return c;
}

}  // namespace fern
