// Splits model output into reasoning, content and tool calls (MODEL.md 5.3), token by token for streaming or in
// one pass; both give the same result. What cannot be parsed is returned as content (never dropped) and logged.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fern {

struct ToolCallDelta {
  int index = 0;            // call number in this message
  std::string id;           // set on the first delta of a call ("call_...")
  std::string name;         // set on the first delta of a call
  std::string arguments;    // next piece of the JSON arguments string
};

struct OutputDelta {
  std::string reasoning;               // reasoning text to append
  std::string content;                 // content text to append
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedToolCall {
  std::string id, name, arguments;  // arguments: a JSON object as text
};

struct ParsedOutput {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
};

struct OutputParserOptions {
  bool thinking = true;          // the prompt ended with "<think>\n": output starts in reasoning
  nlohmann::json tools;          // OpenAI tools array (schemas convert parameter values); null = no tool parsing
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions opt);
  // Feeds the decoded text of the next token(s). Returns what became final.
  OutputDelta push(const std::string& text);
  // End of generation (stop, length): flushes held-back text; an unfinished tool call is returned as content.
  OutputDelta finish();
  // Everything so far, as one message.
  const ParsedOutput& result() const { return result_; }
  // One pass over a whole output.
  static ParsedOutput parse(const std::string& text, const OutputParserOptions& opt);

 private:
  OutputParserOptions opt_;
  ParsedOutput result_;
  std::string buffer_;
  int state_ = 0;
};

}  // namespace fern
