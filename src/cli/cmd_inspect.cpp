// `fern inspect DIR`: validates a model directory (config.json, every safetensors header, the binding of every
// required tensor) and prints a summary; `--tensors` lists every tensor with dtype, shape and file.
#include <fmt/ranges.h>

#include <filesystem>

#include "cli/command.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/loader.h"
#include "model/progress_bar.h"

namespace {

struct InspectArgs {
  std::string dir;
  bool tensors = false;
};

fern::cli::Command reg("inspect", "Validate a model directory and summarise it", [](CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  app.add_option("DIR", a->dir, "model directory")->required();
  app.add_flag("--tensors", a->tensors, "list every tensor");
  return [a]() -> int {
    const fern::ModelConfig c = fern::load_model_config(a->dir);
    auto files = fern::CheckpointFiles::open(a->dir);
    if (a->tensors) {
      for (const auto& n : files->names()) {
        const fern::TensorRef* t = files->find(n);
        fmt::print("{:<72} {:<5} [{}] {}\n", n, t->entry->dtype_name, fmt::join(t->entry->shape, ", "),
                   std::filesystem::path(t->file).filename().string());
      }
    }
    fmt::print("model_type {}  layers {} ({} attention, {} Gated DeltaNet)  hidden {}  vocab {}\n", c.model_type,
               c.num_hidden_layers, c.num_attention_layers(), c.num_linear_layers(), c.hidden_size, c.vocab_size);
    fmt::print("attention {}/{} heads x {}  GDN {}/{} heads x {}/{}  experts {} top-{} x {} + shared {}\n",
               c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.linear_num_key_heads,
               c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim, c.num_experts,
               c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size);
    if (c.quantization)
      fmt::print("quantization: {} bits, group {}, {} overrides\n", c.quantization->defaults.bits,
                 c.quantization->defaults.group_size, c.quantization->overrides.size());
    fmt::print("eos ids [{}]\n", fmt::join(c.eos_token_ids, ", "));
    fmt::print("{} files, {} tensors, {:.3f} GB\n", files->files().size(), files->names().size(),
               files->total_bytes() / 1e9);
    fern::ProgressBar bar("binding");
    fern::LoadOptions lo;
    lo.progress = [&bar](size_t done, size_t total) { bar.update(done, total); };
    auto w = fern::bind_model(c, *files, fern::detect_format(a->dir), lo);
    fmt::print("format {}: all {} layers bound\n", fern::format_name(fern::detect_format(a->dir)), w->layers.size());
    return 0;
  };
});

}  // namespace
