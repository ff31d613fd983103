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
  // parser: chat options (nullopt = plain text, the completions endpoint).
  OutputShaper(std::optional<OutputParserOptions> parser, bool parallel_tool_calls);
  // Chat: delta objects ({"reasoning_content"}, {"content"}, {"tool_calls": [...]}) in order.
  // Completions: one {"text"} object per non-empty piece.
  std::vector<nlohmann::json> push(const std::string& text);
  std::vector<nlohmann::json> finish();

  // Chat: the whole message once finished ({"role","content","reasoning_content"?,"tool_calls"?}).
  nlohmann::json message() const;
  const std::string& text() const { return text_; }
  bool has_tool_calls() const;

 private:
  std::vector<nlohmann::json> shape(const OutputDelta& d);
  std::optional<OutputParser> parser_;
  bool parallel_;
  std::string text_;
};

}  // namespace fern::server
