// Streaming split of model output into reasoning, content and tool calls (MODEL.md 5.3). One state machine
// serves both paths: parse() pushes the whole text at once, so streamed and one-pass results agree by
// construction (and the tests check it with random splits).
#include "tokenizer/output_parser.h"

#include <random>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/py_format.h"
#include "tokenizer/tool_call_xml.h"

namespace fern {
namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kFunction = "<function=";
enum State { kReasoning = 0, kContent = 1, kToolCall = 2 };

// Length of the longest suffix of `s` that is a proper prefix of `tag` (text that may still become the tag).
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

OutputParser::OutputParser(OutputParserOptions opt) : opt_(std::move(opt)) {
  if (opt_.id_seed == 0) opt_.id_seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^ 1;
  state_ = opt_.thinking ? kReasoning : kContent;
}

OutputDelta OutputParser::push(const std::string& text) {
  OutputDelta d;
  if (finished_) return d;
  buffer_ += text;
  process(false, d);
  return d;
}

OutputDelta OutputParser::finish() {
  OutputDelta d;
  if (finished_) return d;
  process(true, d);
  if (state_ == kReasoning) end_reasoning();
  // Whitespace right after the last tool call separates calls; any other trailing whitespace is the model's text.
  if (!held_space_.empty() && !after_call_) {
    d.content += held_space_;
    result_.content += held_space_;
  }
  held_space_.clear();
  finished_ = true;
  return d;
}

ParsedOutput OutputParser::parse(const std::string& text, const OutputParserOptions& opt) {
  OutputParser p(opt);
  p.push(text);
  p.finish();
  return p.result_;
}

void OutputParser::emit_reasoning(std::string_view text, OutputDelta& d) {
  if (!started_) {  // the prompt already ended with "<think>\n"; newlines the model repeats are not reasoning
    while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
    if (text.empty()) return;
    started_ = true;
  }
  size_t nl = 0;
  while (nl < text.size() && text[text.size() - 1 - nl] == '\n') ++nl;
  if (nl == text.size()) {  // only newlines: they wait for what follows
    held_newlines_ += nl;
    return;
  }
  std::string out(held_newlines_, '\n');
  out.append(text.substr(0, text.size() - nl));
  held_newlines_ = nl;
  d.reasoning += out;
  result_.reasoning += out;
}

void OutputParser::end_reasoning() {
  held_newlines_ = 0;  // "...reasoning\n</think>": the newline before the tag is format
  started_ = false;
}

void OutputParser::emit_content(std::string_view text, OutputDelta& d) {
  if (!started_) {  // "</think>\n\n" then the answer
    while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
    if (text.empty()) return;
    started_ = true;
  }
  size_t ws = 0;
  while (ws < text.size() && is_ws(text[text.size() - 1 - ws])) ++ws;
  if (ws == text.size()) {
    held_space_.append(text);
    return;
  }
  std::string out = std::move(held_space_);
  out.append(text.substr(0, text.size() - ws));
  held_space_ = std::string(text.substr(text.size() - ws));
  after_call_ = false;
  d.content += out;
  result_.content += out;
}

void OutputParser::close_tool_call(std::string_view raw, OutputDelta& d) {
  std::string why, args;
  auto call = parse_xml_tool_call(raw, opt_.tools, &why);
  if (call) {
    try {
      args = py::dumps(call->arguments);
    } catch (const Error& e) {  // e.g. a value that is not valid UTF-8
      why = e.what();
      call.reset();
    }
  }
  if (!call) {
    log::warn("tool call returned as content: {}", why);
    std::string text = std::move(held_space_);
    held_space_.clear();
    text.append(raw);
    after_call_ = false;
    started_ = true;
    d.content += text;
    result_.content += text;
    return;
  }
  held_space_.clear();  // whitespace between the prose and the call belongs to the format
  const int index = int(result_.tool_calls.size());
  ParsedToolCall pc;
  pc.id = fmt::format("call_{:016x}{:08x}", splitmix(opt_.id_seed + uint64_t(index)),
                      uint32_t(splitmix(~opt_.id_seed + uint64_t(index))));
  pc.name = call->name;
  pc.arguments = std::move(args);
  d.tool_calls.push_back(ToolCallDelta{index, pc.id, pc.name, pc.arguments});
  result_.tool_calls.push_back(std::move(pc));
  after_call_ = true;
  started_ = true;
}

void OutputParser::process(bool final, OutputDelta& d) {
  const bool tools = !opt_.tools.is_null();
  while (true) {
    std::string_view b = buffer_;
    if (state_ == kReasoning) {
      if (!started_ && held_newlines_ == 0) {  // a "<think>" the model writes anyway is dropped
        size_t k = 0;
        while (k < b.size() && b[k] == '\n') ++k;
        std::string_view rest = b.substr(k);
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          buffer_.erase(0, k + kThinkOpen.size());
          continue;
        }
        if (!final && kThinkOpen.substr(0, rest.size()) == rest) return;  // may still become "<think>"
      }
      const size_t close = b.find(kThinkClose);
      const size_t call = tools ? b.find(kCallOpen) : std::string_view::npos;
      if (close != std::string_view::npos && (call == std::string_view::npos || close < call)) {
        emit_reasoning(b.substr(0, close), d);
        end_reasoning();
        state_ = kContent;
        buffer_.erase(0, close + kThinkClose.size());
        continue;
      }
      if (call != std::string_view::npos) {
        // A <tool_call> followed by <function= ends unfinished reasoning (the model skipped </think>).
        size_t k = call + kCallOpen.size();
        while (k < b.size() && is_ws(b[k])) ++k;
        std::string_view after = b.substr(k);
        if (after.substr(0, kFunction.size()) == kFunction) {
          emit_reasoning(b.substr(0, call), d);
          end_reasoning();
          state_ = kToolCall;
          buffer_.erase(0, call);
          continue;
        }
        if (!final && kFunction.substr(0, after.size()) == after) {  // undecided yet
          emit_reasoning(b.substr(0, call), d);
          buffer_.erase(0, call);
          return;
        }
        emit_reasoning(b.substr(0, call + kCallOpen.size()), d);
        buffer_.erase(0, call + kCallOpen.size());
        continue;
      }
      size_t hold = final ? 0 : std::max(partial_tag(b, kThinkClose), tools ? partial_tag(b, kCallOpen) : 0);
      emit_reasoning(b.substr(0, b.size() - hold), d);
      buffer_.erase(0, b.size() - hold);
      return;
    }
    if (state_ == kContent) {
      const size_t call = tools ? b.find(kCallOpen) : std::string_view::npos;
      if (call != std::string_view::npos) {
        emit_content(b.substr(0, call), d);
        state_ = kToolCall;
        buffer_.erase(0, call);
        continue;
      }
      const size_t hold = final || !tools ? 0 : partial_tag(b, kCallOpen);
      emit_content(b.substr(0, b.size() - hold), d);
      buffer_.erase(0, b.size() - hold);
      return;
    }
    // Inside a call: wait for </tool_call>, then parse the whole block.
    const size_t end = b.find(kCallClose);
    if (end != std::string_view::npos) {
      close_tool_call(b.substr(0, end + kCallClose.size()), d);
      buffer_.erase(0, end + kCallClose.size());
      state_ = kContent;
      continue;
    }
    if (final && !b.empty()) {  // cut off (max_tokens): what the model wrote is returned, not dropped
      log::warn("unfinished tool call returned as content ({} bytes)", b.size());
      std::string text(b);
      std::string out = std::move(held_space_);
      held_space_.clear();
      out += text;
      after_call_ = false;
      d.content += out;
      result_.content += out;
      buffer_.clear();
      state_ = kContent;
    }
    return;
  }
}

}  // namespace fern
