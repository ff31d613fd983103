#include "cli/setup.h"

#include <fstream>
#include <sstream>

#include "core/log.h"
#include "model/loader.h"
#include "model/synth.h"

namespace fern::cli {
namespace {

ModelConfig load_model_config_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace

void ModelSource::add_options(CLI::App& app) {
  app.add_option("--model", model_dir, "Model directory (config.json + safetensors, HF bf16 or MLX 4-bit)");
  app.add_option("--synth", synth_preset, "Build a synthetic model in memory instead: tiny | small | qwen3.6-35b-a3b");
  app.add_option("--synth-config", synth_config, "Build a synthetic model of this config.json in memory");
  app.add_option("--synth-format", synth_format, "Layout of the synthetic model: hf (bf16) | mlx4")
      ->check(CLI::IsMember({"hf", "mlx4"}));
  app.add_option("--seed", seed, "Seed of the synthetic model");
  app.add_option("--logit-scale", logit_scale, "Scale of the synthetic lm_head (peaked logits)");
}

std::shared_ptr<const ModelWeights> ModelSource::load() const {
  if (!model_dir.empty()) {
    log::info("loading {}", model_dir);
    return load_model(model_dir);
  }
  SynthOptions opt;
  opt.seed = seed;
  opt.format = synth_format == "hf" ? CheckpointFormat::HfBf16 : CheckpointFormat::Mlx4;
  opt.logit_scale = logit_scale;
  if (!synth_config.empty()) {
    log::info("building a synthetic model of {} (seed {}) in memory", synth_config, seed);
    return synth_weights(load_model_config_file(synth_config), opt);
  }
  const std::string preset = synth_preset.empty() ? "tiny" : synth_preset;
  log::info("building synthetic model '{}' (seed {}) in memory", preset, seed);
  return synth_weights(fern::synth_preset(preset), opt);
}

std::string ModelSource::describe() const {
  if (!model_dir.empty()) return model_dir;
  if (!synth_config.empty()) return "synth-config:" + synth_config;
  return "synth:" + (synth_preset.empty() ? std::string("tiny") : synth_preset);
}

}  // namespace fern::cli
