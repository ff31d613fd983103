#include "server/output_shaper.h"

#include <algorithm>
#include <string_view>

namespace fern::server {

using nlohmann::json;

namespace {
constexpr std::string_view kThinkOpen = "<think>";
}

OutputShaper::OutputShaper(std::optional<OutputParserOptions> parser, bool parallel_tool_calls, bool detect_think)
    : opts_(std::move(parser)), parallel_(parallel_tool_calls) {
  if (!opts_) return;
  probing_ = detect_think && !opts_->thinking;
  if (!probing_) parser_.emplace(*opts_);
}

std::vector<json> OutputShaper::feed(const std::string& text) {
  if (!probing_) return shape(parser_->push(text));
  probe_ += text;
  const size_t n = std::min(probe_.size(), kThinkOpen.size());
  if (probe_.compare(0, n, kThinkOpen, 0, n) == 0 && probe_.size() < kThinkOpen.size()) return {};  // undecided
  probing_ = false;
  if (probe_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) opts_->thinking = true;  // the parser drops the tag
  parser_.emplace(*opts_);
  std::string all;
  all.swap(probe_);
  return shape(parser_->push(all));
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
  if (!opts_) {
    if (text.empty()) return {};
    return {json{{"text", text}}};
  }
  return feed(text);
}

std::vector<json> OutputShaper::finish() {
  if (!opts_) return {};
  std::vector<json> out;
  if (probing_) {  // the whole output was a prefix of "<think>": it is content
    probing_ = false;
    parser_.emplace(*opts_);
    out = shape(parser_->push(probe_));
    probe_.clear();
  }
  for (auto& d : shape(parser_->finish())) out.push_back(std::move(d));
  return out;
}

bool OutputShaper::has_tool_calls() const { return parser_ && !parser_->result().tool_calls.empty(); }

json OutputShaper::message() const {
  json m = {{"role", "assistant"}};
  if (!opts_ || !parser_) {
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
