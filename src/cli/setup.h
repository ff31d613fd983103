// Shared by the subcommands: choosing a backend and getting model weights (a checkpoint directory, or a synthetic
// model built in memory from a preset).
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "model/weights.h"
#include "engine/runtime.h"
#include "ops/backend.h"

namespace fern::cli {

struct ModelSource {
  std::string model_dir;        // --model DIR
  std::string synth_preset;     // --synth PRESET (built in memory, no disk)
  std::string synth_config;     // --synth-config FILE (a config.json to build in memory)
  std::string synth_format = "mlx4";  // --synth-format hf | mlx4
  uint64_t seed = 1;            // --seed
  float logit_scale = 1.0f;     // --logit-scale
  void add_options(CLI::App& app);
  std::shared_ptr<const ModelWeights> load() const;
  std::string describe() const;
};

// Backends come from fern::make_backend (engine/runtime.h).
using fern::make_backend;

}  // namespace fern::cli
