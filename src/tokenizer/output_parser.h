// Splits model output into reasoning, content and tool calls (MODEL.md 5.3), token by token for streaming or in
// one pass; both give the same result. What cannot be parsed is returned as content (never dropped) and logged.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
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
  uint64_t id_seed = 0;          // seeds the "call_..." ids; 0 = a random seed (tests fix it to compare runs)
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
  void process(bool final, OutputDelta& d);
  void emit_reasoning(std::string_view text, OutputDelta& d);
  void end_reasoning();
  void emit_content(std::string_view text, OutputDelta& d);
  void close_tool_call(std::string_view raw, OutputDelta& d);

  OutputParserOptions opt_;
  ParsedOutput result_;
  std::string buffer_;           // text not yet decided (a tag may be starting, a call is not closed yet)
  int state_ = 0;                // 0 reasoning, 1 content, 2 inside <tool_call>
  bool started_ = false;         // something of the current section was emitted (leading newlines are dropped)
  size_t held_newlines_ = 0;     // reasoning: newlines at the end, dropped if </think> follows
  std::string held_space_;       // content: trailing whitespace, dropped before a tool call
  bool after_call_ = false;      // no content since the last tool call
  bool finished_ = false;
};

}  // namespace fern
