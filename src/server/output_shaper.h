// Turns the generated text of one choice into OpenAI response pieces: for chat, the reasoning / content /
// tool-call deltas of the output parser (with parallel_tool_calls=false keeping only the first call); for
// completions, the text itself.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/output_parser.h"

namespace fern::server {

class OutputShaper {
 public:
  // parser: chat options (nullopt = plain text, the completions endpoint). detect_think: the template left the
  // think block to the model (Qwen3 with thinking on); when the output opens with "<think>" it is parsed as
  // reasoning, as if the prompt had ended with it.
  OutputShaper(std::optional<OutputParserOptions> parser, bool parallel_tool_calls, bool detect_think = false);
  // Chat: delta objects ({"reasoning_content"}, {"content"}, {"tool_calls": [...]}) in order.
  // Completions: one {"text"} object per non-empty piece.
  std::vector<nlohmann::json> push(const std::string& text);
  std::vector<nlohmann::json> finish();

  // Chat: the whole message once finished ({"role","content","reasoning_content"?,"tool_calls"?}).
  nlohmann::json message() const;
  const std::string& text() const { return text_; }
  bool has_tool_calls() const;
  // The output was parsed as starting in reasoning.
  bool thinking() const { return opts_ && opts_->thinking; }

 private:
  std::vector<nlohmann::json> shape(const OutputDelta& d);
  std::vector<nlohmann::json> feed(const std::string& text);
  std::optional<OutputParserOptions> opts_;
  std::optional<OutputParser> parser_;  // created once the start of the output is known
  bool parallel_;
  bool probing_ = false;                // still deciding whether the output opens with "<think>"
  std::string probe_;
  std::string text_;
};

}  // namespace fern::server
