// Synthetic checkpoints (`fern synth`): presets, the streaming generator, the on-disk writer and the in-memory
// model. Every layout derives from one HF-layout generator (synth_values.h); the mlx4 layout goes through the
// same converter as `fern quantize`. Tested by tests/model/test_synth.cpp.
#include "model/synth.h"

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "model/checkpoint.h"
#include "model/hf_layout.h"
#include "model/safetensors_writer.h"
#include "model/synth_values.h"
#include "quant/mlx_convert.h"

namespace fern {
namespace fs = std::filesystem;

namespace {

// The Qwen3 tokenizer that synthetic directories ship with (third_party/npm/.../tokenizer-qwen3):
// <|im_end|> and <|endoftext|>.
const std::vector<int32_t> kSynthEos = {151645, 151643};

std::vector<LayerType> every_fourth_full(int layers) {
  std::vector<LayerType> t;
  for (int i = 0; i < layers; ++i) t.push_back((i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  return t;
}

HfRowReader synth_reader(const ModelConfig& cfg, const SynthOptions& opt) {
  // Keys and distributions are computed once per tensor name and looked up by the (thread-safe) reader.
  auto table = std::make_shared<std::map<std::string, std::pair<uint64_t, SynthDist>>>();
  for (const auto& spec : hf_tensor_specs(cfg))
    (*table)[spec.name] = {synth_tensor_key(opt.seed, spec.name), synth_distribution(cfg, spec, opt.logit_scale)};
  return [table](const HfTensorSpec& spec, int64_t row0, int64_t n, float* out) {
    const auto& [key, dist] = table->at(spec.name);
    synth_fill(dist, key, row0 * spec.cols(), n * spec.cols(), out);
  };
}

std::vector<StreamTensor> synth_stream(const ModelConfig& cfg, const SynthOptions& opt) {
  const auto specs = hf_tensor_specs(cfg);
  if (opt.format == CheckpointFormat::HfBf16) return hf_stream_tensors(specs, synth_reader(cfg, opt));
  const ModelConfig qcfg = synth_checkpoint_config(cfg, CheckpointFormat::Mlx4);
  return mlx_stream_tensors(qcfg, specs, *qcfg.quantization, synth_reader(cfg, opt));
}

}  // namespace

ModelConfig synth_preset(const std::string& name) {
  ModelConfig c;  // defaults are the 35B-A3B values (config.h)
  c.model_type = "qwen3_5_moe";
  c.eos_token_ids = kSynthEos;
  if (name == "qwen3.6-35b-a3b") {
    c.layer_types = every_fourth_full(c.num_hidden_layers);
  } else if (name == "tiny") {
    // Real head dims (attention 256, GDN 128) so GPU kernels apply; few heads and experts so a token takes
    // milliseconds on the CPU. The vocabulary fits the Qwen3 tokenizer shipped with the directory.
    c.vocab_size = 151936;
    c.hidden_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.linear_num_key_heads = 2;
    c.linear_num_value_heads = 4;
    c.num_experts = 16;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 64;
    c.shared_expert_intermediate_size = 64;
    c.layer_types = every_fourth_full(c.num_hidden_layers);
  } else if (name == "small") {
    c.vocab_size = 151936;
    c.hidden_size = 1024;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.linear_num_key_heads = 8;
    c.linear_num_value_heads = 16;
    c.num_experts = 64;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 256;
    c.shared_expert_intermediate_size = 256;
    c.layer_types = every_fourth_full(c.num_hidden_layers);
  } else {
    fail("unknown synth preset \"{}\" (tiny, small, qwen3.6-35b-a3b)", name);
  }
  validate_model_config(c, "preset " + name);
  return c;
}

ModelConfig synth_checkpoint_config(const ModelConfig& cfg, CheckpointFormat format) {
  ModelConfig c = cfg;
  if (format == CheckpointFormat::Mlx4) c.quantization = mlx_default_quant(cfg);
  else c.quantization.reset();
  return c;
}

float synth_hf_value(const ModelConfig& cfg, const SynthOptions& opt, const std::string& name, int64_t index) {
  for (const auto& spec : hf_tensor_specs(cfg)) {
    if (spec.name != name) continue;
    float v = 0;
    synth_fill(synth_distribution(cfg, spec, opt.logit_scale), synth_tensor_key(opt.seed, name), index, 1, &v);
    return v;
  }
  fail("synthetic model has no tensor \"{}\"", name);
}

void synth_for_each_tensor(const ModelConfig& cfg, const SynthOptions& opt,
                           const std::function<void(const SynthTensor&)>& fn) {
  for (const auto& t : synth_stream(cfg, opt)) fn(t);
}

void write_synth_checkpoint(const ModelConfig& cfg, const SynthOptions& opt, const std::string& out_dir,
                            const std::string& tokenizer_json) {
  validate_model_config(cfg, "synthetic config");
  fs::create_directories(out_dir);
  ShardWriteOptions wo;
  if (opt.format == CheckpointFormat::HfBf16) wo.metadata = {{"format", "pt"}};
  wo.progress = opt.progress;
  write_safetensors(out_dir, synth_stream(cfg, opt), wo);
  const ModelConfig written = synth_checkpoint_config(cfg, opt.format);
  auto write_text = [&](const std::string& file, const std::string& text) {
    std::FILE* f = std::fopen((fs::path(out_dir) / file).c_str(), "wb");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size()) fail("{}/{}: cannot write", out_dir, file);
    std::fclose(f);
  };
  write_text("config.json", model_config_to_json(written));
  write_text("generation_config.json", generation_config_to_json(written));
  if (!tokenizer_json.empty()) {
    std::error_code ec;
    if (!fs::exists(tokenizer_json, ec)) {
      log::warn("tokenizer {} not found; the synthetic model has no tokenizer.json", tokenizer_json);
    } else {
      fs::copy_file(tokenizer_json, fs::path(out_dir) / "tokenizer.json", fs::copy_options::overwrite_existing);
      const fs::path tc = fs::path(tokenizer_json).parent_path() / "tokenizer_config.json";
      if (fs::exists(tc, ec))
        fs::copy_file(tc, fs::path(out_dir) / "tokenizer_config.json", fs::copy_options::overwrite_existing);
    }
  }
}

std::shared_ptr<ModelWeights> synth_weights(const ModelConfig& cfg, const SynthOptions& opt) {
  validate_model_config(cfg, "synthetic config");
  MemoryTensors mem("synthetic model (seed " + std::to_string(opt.seed) + ")");
  for (const auto& t : synth_stream(cfg, opt)) {
    std::vector<uint8_t*> dst;
    for (const auto& p : t.parts) dst.push_back(mem.add(p.name, p.dtype, p.shape));
    t.fill_parallel(0, t.rows, dst.data());
  }
  return bind_model(synth_checkpoint_config(cfg, opt.format), mem, opt.format);
}

}  // namespace fern
