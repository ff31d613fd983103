#include "server/output_shaper.h"

namespace fern::server {

using nlohmann::json;

OutputShaper::OutputShaper(std::optional<OutputParserOptions> parser, bool parallel_tool_calls)
    : parallel_(parallel_tool_calls) {
  if (parser) parser_.emplace(std::move(*parser));
}

std::vector<json> OutputShaper::shape(const OutputDelta& d) {
  std::vector<json> out;
  if (!d.reasoning.empty()) out.push_back({{"reasoning_content", d.reasoning}});
  if (!d.content.empty()) out.push_back({{"content", d.content}});
  json calls = json::array();
  for (const auto& tc : d.tool_calls) {
    if (!parallel_ && tc.index > 0) continue;
    json c = {{"index", tc.index}};
    if (!tc.id.empty() || !tc.name.empty()) {
      c["id"] = tc.id;
      c["type"] = "function";
      c["function"] = {{"name", tc.name}, {"arguments", tc.arguments}};
    } else {
      c["function"] = {{"arguments", tc.arguments}};
    }
    calls.push_back(std::move(c));
  }
  if (!calls.empty()) out.push_back({{"tool_calls", std::move(calls)}});
  return out;
}

std::vector<json> OutputShaper::push(const std::string& text) {
  text_ += text;
  if (!parser_) {
    if (text.empty()) return {};
    return {json{{"text", text}}};
  }
  return shape(parser_->push(text));
}

std::vector<json> OutputShaper::finish() {
  if (!parser_) return {};
  return shape(parser_->finish());
}

bool OutputShaper::has_tool_calls() const { return parser_ && !parser_->result().tool_calls.empty(); }

json OutputShaper::message() const {
  json m = {{"role", "assistant"}};
  if (!parser_) {
    m["content"] = text_;
    return m;
  }
  const ParsedOutput& r = parser_->result();
  json calls = json::array();
  for (size_t i = 0; i < r.tool_calls.size(); ++i) {
    if (!parallel_ && i > 0) break;
    const auto& tc = r.tool_calls[i];
    calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
  }
  m["content"] = (r.content.empty() && !calls.empty()) ? json(nullptr) : json(r.content);
  if (!r.reasoning.empty()) m["reasoning_content"] = r.reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  m["refusal"] = nullptr;
  return m;
}

}  // namespace fern::server
