// `fern chat`: an interactive terminal chat over the engine (no HTTP): streamed replies, reasoning shown dimmed,
// multi-turn reuse through the session cache. Commands: /reset, /think on|off, /exit.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/runtime.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/output_parser.h"

namespace fern::cli {

static Command reg("chat", "Chat with the model in the terminal", [](CLI::App& app) {
  struct Opts {
    RuntimeOptions ro;
    std::string system;
    int64_t max_tokens = 1024;
    float temperature = 0.7f;
    bool no_think = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model,-m", o->ro.model_dir, "Model directory (no --model: the built-in demo model)");
  app.add_option("--tokenizer", o->ro.tokenizer_path, "tokenizer.json to use instead of the model's");
  app.add_option("--backend", o->ro.backend, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--ctx", o->ro.ctx, "Context length in tokens");
  app.add_option("--threads", o->ro.threads, "CPU backend threads (0 = all cores)");
  app.add_option("--prefill-chunk", o->ro.prefill_chunk, "Prompt tokens per forward call (0 = the backend's choice)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--system", o->system, "System prompt");
  app.add_option("--max-tokens,-n", o->max_tokens, "Tokens per reply at most")->capture_default_str();
  app.add_option("--temperature,-t", o->temperature, "0 = greedy")->capture_default_str();
  app.add_flag("--no-think", o->no_think, "Start with thinking off (/think on turns it back on)");
  return [o]() -> int {
    Runtime rt = load_runtime(o->ro);
    const bool tty = isatty(1);
    const char* dim = tty ? "\x1b[2m" : "";
    const char* reset = tty ? "\x1b[0m" : "";
    SessionCache cache(rt.engine->backend(), rt.engine->config(), size_t(2) << 30);
    GeneratorOptions go;
    go.eos_ids = rt.eos_ids;
    Generator gen(*rt.engine, *rt.tokenizer, &cache, go);
    nlohmann::json history = nlohmann::json::array();
    if (!o->system.empty()) history.push_back({{"role", "system"}, {"content", o->system}});
    bool thinking = !o->no_think;
    std::fprintf(stderr, "fern chat with %s on %s. /reset clears the conversation, /think on|off, /exit quits.\n",
                 rt.model_id.c_str(), rt.backend_name.c_str());
    std::string line;
    while (true) {
      std::printf("%s> %s", tty ? "\x1b[1m" : "", reset);
      std::fflush(stdout);
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      if (line == "/exit" || line == "/quit") break;
      if (line == "/reset") {
        history = nlohmann::json::array();
        if (!o->system.empty()) history.push_back({{"role", "system"}, {"content", o->system}});
        std::printf("(conversation cleared)\n");
        continue;
      }
      if (line == "/think on" || line == "/think off") {
        thinking = line == "/think on";
        std::printf("(thinking %s)\n", thinking ? "on" : "off");
        continue;
      }
      history.push_back({{"role", "user"}, {"content", line}});
      ChatOptions co;
      co.kind = rt.template_kind;
      co.enable_thinking = thinking;
      std::string text;
      try {
        text = render_chat(history, nullptr, co);
      } catch (const Error& e) {
        std::printf("error: %s\n", e.what());
        history.erase(history.end() - 1);
        continue;
      }
      GenerateRequest req;
      req.prompt = rt.tokenizer->encode(text);
      if (static_cast<int64_t>(req.prompt.size()) >= rt.engine->max_context()) {
        std::printf("error: the conversation (%zu tokens) fills the context (%lld); /reset to start over\n",
                    req.prompt.size(), static_cast<long long>(rt.engine->max_context()));
        history.erase(history.end() - 1);
        continue;
      }
      req.snapshot_at = chat_snapshot_points(req.prompt, *rt.tokenizer);
      req.snapshot_reply = true;
      req.max_tokens = o->max_tokens;
      req.sampling.temperature = o->temperature;
      OutputParserOptions po;
      po.thinking = text.size() >= 8 && text.compare(text.size() - 8, 8, "<think>\n") == 0;
      OutputParser parser(po);
      bool in_reasoning = false;
      auto show = [&](const OutputDelta& d) {
        if (!d.reasoning.empty()) {
          if (!in_reasoning) std::printf("%s", dim);
          in_reasoning = true;
          std::printf("%s", d.reasoning.c_str());
        }
        if (!d.content.empty()) {
          if (in_reasoning) std::printf("%s\n", reset);
          in_reasoning = false;
          std::printf("%s", d.content.c_str());
        }
        for (const auto& tc : d.tool_calls) std::printf("%s%s", tc.name.c_str(), tc.arguments.c_str());
        std::fflush(stdout);
      };
      auto r = gen.generate(req, [&](const std::string& s) { show(parser.push(s)); });
      show(parser.finish());
      if (in_reasoning) std::printf("%s", reset);
      const double tps = r.completion_tokens > 1 && r.decode_seconds > 0
                             ? double(r.completion_tokens - 1) / r.decode_seconds : 0.0;
      std::printf("\n%s[%lld tokens, %.1f tok/s, %lld prompt tokens reused]%s\n", dim,
                  static_cast<long long>(r.completion_tokens), tps, static_cast<long long>(r.cached_tokens), reset);
      const auto& res = parser.result();
      nlohmann::json msg = {{"role", "assistant"}, {"content", res.content}};
      if (!res.reasoning.empty()) msg["reasoning_content"] = res.reasoning;
      history.push_back(msg);
    }
    return 0;
  };
});

}  // namespace fern::cli
