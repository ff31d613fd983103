#include "server/anthropic_request.h"

#include <fmt/format.h>

#include "server/api_error.h"

namespace fern::server {

using ojson = nlohmann::ordered_json;

namespace {

// A text field: a string, or a list of {"type": "text"} blocks (joined).
std::string text_of(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + " must be a string or a list of text blocks", where);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& b = c[i];
    if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
      throw bad_request(fmt::format("{}[{}]: only text blocks are supported here", where, i), where);
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

ojson translate(const ojson& a) {
  if (!a.is_object()) throw bad_request("the request body must be a JSON object");
  if (!a.contains("max_tokens")) throw bad_request("max_tokens is required", "max_tokens");
  ojson c = ojson::object();
  ojson msgs = ojson::array();
  if (a.contains("system") && !a["system"].is_null())
    msgs.push_back({{"role", "system"}, {"content", text_of(a["system"], "system")}});
  if (!a.contains("messages") || !a["messages"].is_array() || a["messages"].empty())
    throw bad_request("messages must be a non-empty list", "messages");
  const ojson& in = a["messages"];
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    const ojson& m = in[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
      throw bad_request(where + " must be an object with a role and content", where);
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant") throw bad_request(where + ".role must be user or assistant", where + ".role");
    const ojson& content = m["content"];
    if (content.is_string()) {
      msgs.push_back({{"role", role}, {"content", content}});
      continue;
    }
    if (!content.is_array()) throw bad_request(where + ".content must be a string or a list of blocks", where + ".content");
    ojson assistant = {{"role", "assistant"}, {"content", ""}};
    std::string text, reasoning;
    ojson calls = ojson::array();
    auto flush_user_text = [&] {
      if (!text.empty()) msgs.push_back({{"role", "user"}, {"content", text}});
      text.clear();
    };
    for (size_t k = 0; k < content.size(); ++k) {
      const std::string bw = fmt::format("{}.content[{}]", where, k);
      const ojson& b = content[k];
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) throw bad_request(bw + " must be a block", bw);
      const std::string type = b["type"].get<std::string>();
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) throw bad_request(bw + ".text must be a string", bw);
        if (!text.empty()) text += "\n";
        text += b["text"].get<std::string>();
      } else if (type == "tool_result" && role == "user") {
        flush_user_text();
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
          throw bad_request(bw + ".tool_use_id must be a string", bw + ".tool_use_id");
        std::string result = b.contains("content") && !b["content"].is_null() ? text_of(b["content"], bw + ".content") : "";
        if (b.value("is_error", false)) result = "Error: " + result;
        msgs.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
          throw bad_request(bw + " needs a string id and name", bw);
        const ojson input = b.contains("input") ? b["input"] : ojson::object();
        if (!input.is_object()) throw bad_request(bw + ".input must be an object", bw + ".input");
        calls.push_back({{"id", b["id"]},
                         {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
      } else if (type == "thinking" && role == "assistant") {
        if (b.contains("thinking") && b["thinking"].is_string()) reasoning += b["thinking"].get<std::string>();
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Encrypted reasoning of another model: nothing this one can read.
      } else {
        throw bad_request(fmt::format("{}: '{}' blocks are not supported in {} messages", bw, type.substr(0, 50), role),
                          bw + ".type");
      }
    }
    if (role == "user") {
      flush_user_text();
    } else {
      assistant["content"] = text;
      if (!reasoning.empty()) assistant["reasoning_content"] = reasoning;
      if (!calls.empty()) {
        assistant["tool_calls"] = calls;
        if (text.empty()) assistant["content"] = nullptr;
      }
      msgs.push_back(assistant);
    }
  }
  c["messages"] = msgs;
  c["max_tokens"] = a["max_tokens"];
  // test_forced_output: honoured only by a server started with --test-forced-output (SERVER.md).
  for (const char* k : {"temperature", "top_p", "top_k", "stream", "test_forced_output"})
    if (a.contains(k)) c[k] = a[k];
  if (a.contains("stop_sequences")) c["stop"] = a["stop_sequences"];
  if (a.contains("tools") && !a["tools"].is_null()) {
    if (!a["tools"].is_array()) throw bad_request("tools must be a list", "tools");
    ojson tools = ojson::array();
    for (size_t i = 0; i < a["tools"].size(); ++i) {
      const ojson& t = a["tools"][i];
      const std::string tw = fmt::format("tools[{}]", i);
      if (!t.is_object()) throw bad_request(tw + " must be an object", tw);
      if (t.contains("type") && t["type"] != "custom")
        throw bad_request(tw + ": only custom tools (name, description, input_schema) are supported", tw + ".type");
      ojson f = {{"name", t.value("name", ojson())}};
      if (t.contains("description")) f["description"] = t["description"];
      if (t.contains("input_schema")) f["parameters"] = t["input_schema"];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    c["tools"] = tools;
  }
  if (a.contains("tool_choice") && !a["tool_choice"].is_null()) {
    const ojson& tc = a["tool_choice"];
    const std::string type = tc.is_object() ? tc.value("type", "") : "";
    if (type == "auto") c["tool_choice"] = "auto";
    else if (type == "any") c["tool_choice"] = "required";
    else if (type == "none") c["tool_choice"] = "none";
    else if (type == "tool") c["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc.value("name", ojson())}}}};
    else throw bad_request("tool_choice.type must be auto, any, tool or none", "tool_choice");
    if (tc.value("disable_parallel_tool_use", false)) c["parallel_tool_calls"] = false;
  }
  // Anthropic's default is no extended thinking; {"type": "enabled"} turns the model's thinking on.
  bool thinking = false;
  if (a.contains("thinking") && a["thinking"].is_object()) thinking = a["thinking"].value("type", "") == "enabled";
  c["chat_template_kwargs"] = {{"enable_thinking", thinking}};
  return c;
}

}  // namespace

ojson chat_from_anthropic(const ojson& a) {
  try {
    return translate(a);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type deep inside a block (e.g. a numeric "type").
    throw bad_request(std::string("malformed request: ") + e.what());
  }
}

}  // namespace fern::server
