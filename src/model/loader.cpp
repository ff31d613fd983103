// load_model(): config.json + safetensors (single or sharded) -> ModelWeights, in either layout (MODEL.md 3).
// Tested by tests/model/test_loader.cpp.
#include "model/loader.h"

#include "core/error.h"
#include "model/binder.h"
#include "model/checkpoint.h"

namespace fern {
namespace {

CheckpointFormat detect_from(const ModelConfig& cfg, const TensorSource& src) {
  if (cfg.quantization) return CheckpointFormat::Mlx4;
  for (const auto& n : src.names()) {
    if (n.rfind("language_model.", 0) == 0) return CheckpointFormat::Mlx4;
    if (n.size() > 7 && n.compare(n.size() - 7, 7, ".scales") == 0) return CheckpointFormat::Mlx4;
  }
  return CheckpointFormat::HfBf16;
}

}  // namespace

const char* format_name(CheckpointFormat f) { return f == CheckpointFormat::Mlx4 ? "mlx4" : "hf"; }

CheckpointFormat detect_format(const std::string& model_dir) {
  const ModelConfig cfg = load_model_config(model_dir);
  auto files = CheckpointFiles::open(model_dir);
  return detect_from(cfg, *files);
}

std::shared_ptr<ModelWeights> bind_model(const ModelConfig& cfg, const TensorSource& src, CheckpointFormat format,
                                         const LoadOptions& opt) {
  uint64_t total = 0;
  for (const auto& n : src.names()) {
    const TensorRef* t = src.find(n);
    total += t->entry->end - t->entry->begin;
  }
  Binder b(src, opt, total);
  auto w = std::make_shared<ModelWeights>();
  w->config = cfg;
  if (format == CheckpointFormat::Mlx4) bind_mlx(b, cfg, *w);
  else bind_hf(b, cfg, *w);
  w->storage.push_back(b.storage());
  if (opt.progress) opt.progress(total, total);
  return w;
}

std::shared_ptr<ModelWeights> load_model(const std::string& model_dir, const LoadOptions& opt) {
  const ModelConfig cfg = load_model_config(model_dir);
  auto files = CheckpointFiles::open(model_dir);
  return bind_model(cfg, *files, detect_from(cfg, *files), opt);
}

}  // namespace fern
