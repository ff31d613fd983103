#include "server/responses_request.h"

#include <fmt/format.h>

#include "server/api_error.h"

namespace fern::server {

using ojson = nlohmann::ordered_json;

namespace {

// Text of a message's content: a string, or parts of type input_text / output_text / text.
std::string text_of(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + " must be a string or a list of content parts", where);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if ((type == "input_text" || type == "output_text" || type == "text") && p.contains("text") && p["text"].is_string()) {
      out += p["text"].get<std::string>();
    } else {
      throw bad_request(fmt::format("{}[{}]: '{}' content is not supported (text only)", where, i, type.substr(0, 50)),
                        where);
    }
  }
  return out;
}

ojson translate(const ojson& r, const ojson* history) {
  if (!r.is_object()) throw bad_request("the request body must be a JSON object");
  ojson msgs = ojson::array();
  if (r.contains("instructions") && !r["instructions"].is_null()) {
    if (!r["instructions"].is_string()) throw bad_request("instructions must be a string", "instructions");
    msgs.push_back({{"role", "system"}, {"content", r["instructions"]}});
  }
  if (history)
    for (const auto& m : *history) msgs.push_back(m);
  if (!r.contains("input")) throw bad_request("input is required", "input");
  const ojson& in = r["input"];
  std::string reasoning;  // a reasoning item waits for the assistant message or calls it belongs to
  auto assistant = [&]() -> ojson& {
    // Function calls join the assistant message just before them, or start one.
    if (msgs.empty() || msgs.back()["role"] != "assistant") {
      msgs.push_back({{"role", "assistant"}, {"content", nullptr}});
    }
    if (!reasoning.empty()) {
      msgs.back()["reasoning_content"] = reasoning;
      reasoning.clear();
    }
    return msgs.back();
  };
  if (in.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", in}});
  } else if (in.is_array()) {
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string w = fmt::format("input[{}]", i);
      const ojson& it = in[i];
      if (!it.is_object()) throw bad_request(w + " must be an object", w);
      const std::string type = it.value("type", it.contains("role") ? "message" : "");
      if (type == "message") {
        const std::string role = it.value("role", "");
        if (role != "user" && role != "assistant" && role != "system" && role != "developer")
          throw bad_request(w + ".role must be user, assistant, system or developer", w + ".role");
        if (!it.contains("content")) throw bad_request(w + ".content is required", w + ".content");
        const std::string text = text_of(it["content"], w + ".content");
        if (role == "assistant") {
          ojson m = {{"role", "assistant"}, {"content", text}};
          if (!reasoning.empty()) m["reasoning_content"] = reasoning;
          reasoning.clear();
          msgs.push_back(m);
        } else {
          msgs.push_back({{"role", role}, {"content", text}});
        }
      } else if (type == "function_call") {
        if (!it.contains("call_id") || !it["call_id"].is_string() || !it.contains("name") || !it["name"].is_string() ||
            !it.contains("arguments") || !it["arguments"].is_string())
          throw bad_request(w + " needs string call_id, name and arguments", w);
        ojson& a = assistant();
        if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
        a["tool_calls"].push_back({{"id", it["call_id"]},
                                   {"type", "function"},
                                   {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}});
      } else if (type == "function_call_output") {
        if (!it.contains("call_id") || !it["call_id"].is_string())
          throw bad_request(w + ".call_id must be a string", w + ".call_id");
        const std::string out = it.contains("output") ? text_of(it["output"], w + ".output") : "";
        msgs.push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", out}});
      } else if (type == "reasoning") {
        for (const char* key : {"content", "summary"})
          if (it.contains(key) && it[key].is_array())
            for (const auto& p : it[key])
              if (p.is_object() && p.contains("text") && p["text"].is_string()) reasoning += p["text"].get<std::string>();
      } else {
        throw bad_request(fmt::format("{}: '{}' items are not supported", w, type.substr(0, 50)), w + ".type");
      }
    }
  } else {
    throw bad_request("input must be a string or a list of items", "input");
  }
  ojson c = ojson::object();
  c["messages"] = msgs;
  if (r.contains("max_output_tokens") && !r["max_output_tokens"].is_null()) c["max_tokens"] = r["max_output_tokens"];
  for (const char* k : {"temperature", "top_p", "parallel_tool_calls", "stream", "prompt_cache_key", "top_logprobs",
                        "test_forced_output"})
    if (r.contains(k) && !r[k].is_null()) c[k] = r[k];
  if (r.contains("tools") && !r["tools"].is_null()) {
    if (!r["tools"].is_array()) throw bad_request("tools must be a list", "tools");
    ojson tools = ojson::array();
    for (size_t i = 0; i < r["tools"].size(); ++i) {
      const ojson& t = r["tools"][i];
      const std::string tw = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", "") != "function")
        throw bad_request(tw + ": only function tools are supported", tw + ".type");
      ojson f = {{"name", t.value("name", ojson())}};
      if (t.contains("description")) f["description"] = t["description"];
      if (t.contains("parameters")) f["parameters"] = t["parameters"];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    c["tools"] = tools;
  }
  if (r.contains("tool_choice") && !r["tool_choice"].is_null()) {
    const ojson& tc = r["tool_choice"];
    if (tc.is_string()) c["tool_choice"] = tc;
    else if (tc.is_object() && tc.value("type", "") == "function")
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc.value("name", ojson())}}}};
    else throw bad_request("tool_choice must be auto, none, required or a function", "tool_choice");
  }
  if (r.contains("text") && r["text"].is_object() && r["text"].contains("format")) {
    const ojson& f = r["text"]["format"];
    const std::string type = f.is_object() ? f.value("type", "") : "";
    if (type == "json_schema") {
      ojson js = {{"name", f.value("name", "schema")}, {"schema", f.value("schema", ojson())}};
      c["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
    } else if (type == "json_object" || type == "text") {
      c["response_format"] = {{"type", type}};
    } else {
      throw bad_request("text.format.type must be text, json_object or json_schema", "text.format");
    }
  }
  if (r.contains("reasoning") && r["reasoning"].is_object() && r["reasoning"].contains("effort") &&
      r["reasoning"]["effort"].is_string())
    c["reasoning_effort"] = r["reasoning"]["effort"];
  return c;
}

}  // namespace

ojson chat_from_responses(const ojson& request, const ojson* history) {
  try {
    return translate(request, history);
  } catch (const nlohmann::json::exception& e) {
    throw bad_request(std::string("malformed request: ") + e.what());
  }
}

}  // namespace fern::server
