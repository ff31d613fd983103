// `fern generate --prompt TEXT`: one generation, printed as it is produced, then the speed.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/runtime.h"
#include "tokenizer/chat_format.h"

namespace fern::cli {

static Command reg("generate", "Generate a completion for one prompt", [](CLI::App& app) {
  struct Opts {
    RuntimeOptions ro;
    std::string prompt;
    bool raw = false, no_think = false;
    int64_t max_tokens = 128;
    float temperature = 0.0f, top_p = 1.0f;
    int top_k = 0;
    int64_t seed = -1;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model,-m", o->ro.model_dir, "Model directory (no --model: the built-in demo model)");
  app.add_option("--tokenizer", o->ro.tokenizer_path, "tokenizer.json to use instead of the model's");
  app.add_option("--backend", o->ro.backend, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--ctx", o->ro.ctx, "Context length in tokens");
  app.add_option("--threads", o->ro.threads, "CPU backend threads (0 = all cores)");
  app.add_option("--prefill-chunk", o->ro.prefill_chunk, "Prompt tokens per forward call (0 = the backend's choice)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prompt,-p", o->prompt, "The prompt (a user message unless --raw)")->required();
  app.add_flag("--raw", o->raw, "Use the prompt as is, without the chat template");
  app.add_flag("--no-think", o->no_think, "Chat template with thinking off");
  app.add_option("--max-tokens,-n", o->max_tokens, "Tokens to generate at most")->capture_default_str();
  app.add_option("--temperature,-t", o->temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", o->top_p, "Nucleus sampling")->capture_default_str();
  app.add_option("--top-k", o->top_k, "0 = off")->capture_default_str();
  app.add_option("--seed", o->seed, "RNG seed (-1 = random)");
  return [o]() -> int {
    if (o->max_tokens < 1) fail("--max-tokens must be at least 1");
    if (o->temperature < 0 || o->top_p <= 0 || o->top_p > 1 || o->top_k < 0)
      fail("--temperature must be >= 0, --top-p in (0, 1], --top-k >= 0");
    Runtime rt = load_runtime(o->ro);
    std::string text = o->prompt;
    if (!o->raw) {
      ChatOptions co;
      co.kind = rt.template_kind;
      co.enable_thinking = !o->no_think;
      text = render_chat(nlohmann::json::array({{{"role", "user"}, {"content", o->prompt}}}), nullptr, co);
    }
    GeneratorOptions go;
    go.eos_ids = rt.eos_ids;
    Generator gen(*rt.engine, *rt.tokenizer, nullptr, go);
    GenerateRequest req;
    req.prompt = rt.tokenizer->encode(text);
    req.max_tokens = o->max_tokens;
    req.sampling.temperature = o->temperature;
    req.sampling.top_p = o->top_p;
    req.sampling.top_k = o->top_k;
    if (o->seed >= 0) req.sampling.seed = static_cast<uint64_t>(o->seed);
    auto r = gen.generate(req, [](const std::string& s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    const double tps = r.completion_tokens > 1 && r.decode_seconds > 0
                           ? double(r.completion_tokens - 1) / r.decode_seconds : 0.0;
    std::fprintf(stderr, "[%lld prompt tokens in %.3f s (%.1f tok/s); %lld generated, %.1f tok/s decode; finish: %s]\n",
                 static_cast<long long>(r.prompt_tokens), r.prefill_seconds,
                 r.prefill_seconds > 0 ? double(r.prompt_tokens) / r.prefill_seconds : 0.0,
                 static_cast<long long>(r.completion_tokens), tps, finish_reason_name(r.finish));
    return 0;
  };
});

}  // namespace fern::cli
