#include "server/request.h"

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "server/api_error.h"

namespace fern::server {

using nlohmann::json;

namespace {

template <class J>
const char* type_name(const J& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::number_float: return "a float";
    default: return "an integer";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* want, const json& v) {
  throw bad_request("'" + param + "' must be " + want + ", not " + type_name(v), param);
}

bool is_number(const json& v) { return v.is_number(); }

double get_number(const json& body, const std::string& key, double lo, double hi, bool lo_open = false) {
  const json& v = body.at(key);
  if (!is_number(v)) wrong_type(key, "a number", v);
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    throw bad_request(fmt::format("'{}' must be {} {} and <= {}; got {}", key, lo_open ? ">" : ">=", lo, hi, x), key);
  return x;
}

int64_t get_int(const json& body, const std::string& key, int64_t lo, int64_t hi) {
  const json& v = body.at(key);
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(hi)) throw bad_request(fmt::format("'{}' must be <= {}; got {}", key, hi, u), key);
    if (int64_t(u) < lo) throw bad_request(fmt::format("'{}' must be >= {}; got {}", key, lo, u), key);
    return int64_t(u);
  }
  if (!v.is_number_integer()) wrong_type(key, "an integer", v);
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw bad_request(fmt::format("'{}' must be between {} and {}; got {}", key, lo, hi, x), key);
  return x;
}

bool get_bool(const json& body, const std::string& key) {
  const json& v = body.at(key);
  if (!v.is_boolean()) wrong_type(key, "a boolean", v);
  return v.get<bool>();
}

bool present(const json& body, const char* key) { return body.contains(key) && !body.at(key).is_null(); }

// Text of a message's content: a string, or an array of {"type":"text","text":...} parts.
void check_content(const json& m, size_t i, const std::string& role) {
  const std::string p = fmt::format("messages[{}].content", i);
  if (!m.contains("content") || m["content"].is_null()) {
    if (role == "assistant") return;  // an assistant turn may carry only tool_calls
    throw bad_request(fmt::format("{} is required for a {} message", p, role), p);
  }
  const json& c = m["content"];
  if (c.is_string()) return;
  if (!c.is_array()) wrong_type(p, "a string or an array of content parts", c);
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    const std::string pp = fmt::format("{}[{}]", p, k);
    if (!part.is_object()) wrong_type(pp, "an object", part);
    if (!part.contains("type") || !part["type"].is_string())
      throw bad_request(pp + ".type must be a string", pp + ".type");
    std::string t = part["type"].get<std::string>();
    if (t != "text")
      throw bad_request(fmt::format("{}: content parts of type '{}' are not supported (text only)", pp,
                                    t.size() > 40 ? t.substr(0, 40) : t),
                        pp + ".type");
    if (!part.contains("text") || !part["text"].is_string())
      throw bad_request(pp + ".text must be a string", pp + ".text");
  }
}

json check_messages(const json& body) {
  if (!body.contains("messages")) throw bad_request("'messages' is required", "messages");
  const json& msgs = body["messages"];
  if (!msgs.is_array()) wrong_type("messages", "an array", msgs);
  if (msgs.empty()) throw bad_request("'messages' must contain at least one message", "messages");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  json out = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) wrong_type(p, "an object", m);
    if (!m.contains("role")) throw bad_request(p + ".role is required", p + ".role");
    if (!m["role"].is_string()) wrong_type(p + ".role", "a string", m["role"]);
    std::string role = m["role"].get<std::string>();
    if (!roles.count(role))
      throw bad_request(fmt::format("{}.role must be one of system, developer, user, assistant, tool; got '{}'", p,
                                    role.size() > 40 ? role.substr(0, 40) + "..." : role),
                        p + ".role");
    check_content(m, i, role);
    json mm = m;
    if (role == "developer") mm["role"] = "system";
    if (role == "tool") {
      if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string())
        throw bad_request(p + ".tool_call_id (a string) is required for a tool message", p + ".tool_call_id");
    }
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const json& tc = m["tool_calls"];
      if (!tc.is_array()) wrong_type(p + ".tool_calls", "an array", tc);
      for (size_t k = 0; k < tc.size(); ++k) {
        const std::string tp = fmt::format("{}.tool_calls[{}]", p, k);
        if (!tc[k].is_object() || !tc[k].contains("function") || !tc[k]["function"].is_object())
          throw bad_request(tp + " must be an object with a 'function' object", tp);
        const json& f = tc[k]["function"];
        if (!f.contains("name") || !f["name"].is_string())
          throw bad_request(tp + ".function.name must be a string", tp + ".function.name");
        if (f.contains("arguments") && !f["arguments"].is_string() && !f["arguments"].is_object())
          throw bad_request(tp + ".function.arguments must be a JSON string", tp + ".function.arguments");
        if (f.contains("arguments") && f["arguments"].is_string()) {
          json parsed = json::parse(f["arguments"].get<std::string>(), nullptr, false);
          if (parsed.is_discarded() || !parsed.is_object())
            throw bad_request(tp + ".function.arguments must be a JSON object encoded as a string",
                              tp + ".function.arguments");
        }
      }
    } else if (role == "assistant" && (!m.contains("content") || m["content"].is_null())) {
      throw bad_request(p + ": an assistant message needs content or tool_calls", p + ".content");
    }
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null() && !m["reasoning_content"].is_string())
      wrong_type(p + ".reasoning_content", "a string", m["reasoning_content"]);
    out.push_back(std::move(mm));
  }
  return out;
}

json check_tools(const json& body, const RequestLimits& lim) {
  if (!present(body, "tools")) return nullptr;
  const json& tools = body["tools"];
  if (!tools.is_array()) wrong_type("tools", "an array", tools);
  if (tools.size() > lim.max_tools) throw bad_request(fmt::format("at most {} tools are allowed", lim.max_tools), "tools");
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    const json& t = tools[i];
    if (!t.is_object()) wrong_type(p, "an object", t);
    if (!t.contains("type") || t["type"] != "function")
      throw bad_request(p + ".type must be \"function\"", p + ".type");
    if (!t.contains("function") || !t["function"].is_object())
      throw bad_request(p + ".function must be an object", p + ".function");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      throw bad_request(p + ".function.name must be a non-empty string", p + ".function.name");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      wrong_type(p + ".function.parameters", "an object (a JSON Schema)", f["parameters"]);
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string())
      wrong_type(p + ".function.description", "a string", f["description"]);
    names.insert(f["name"].get<std::string>());
  }
  if (tools.empty()) return nullptr;
  return tools;
}

void parse_tool_choice(const json& body, ApiRequest& r) {
  r.tool_choice = r.tools.is_null() ? ToolChoice::None : ToolChoice::Auto;
  if (!present(body, "tool_choice")) return;
  const json& tc = body["tool_choice"];
  if (tc.is_string()) {
    std::string s = tc.get<std::string>();
    if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "auto") r.tool_choice = r.tools.is_null() ? ToolChoice::None : ToolChoice::Auto;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or a function object", "tool_choice");
  } else if (tc.is_object()) {
    if (!tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
        !tc["function"]["name"].is_string())
      throw bad_request("'tool_choice' object must be {\"type\":\"function\",\"function\":{\"name\":...}}",
                        "tool_choice");
    r.tool_choice = ToolChoice::Named;
    r.named_tool = tc["function"]["name"].get<std::string>();
  } else {
    wrong_type("tool_choice", "a string or an object", tc);
  }
  if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) && r.tools.is_null())
    throw bad_request("'tool_choice' requires a function but no 'tools' were given", "tool_choice");
  if (r.tool_choice == ToolChoice::Named) {
    bool found = false;
    for (const auto& t : r.tools) found = found || t["function"]["name"] == r.named_tool;
    if (!found) throw bad_request("'tool_choice' names a function that is not in 'tools'", "tool_choice");
  }
}

void parse_sampling(const json& body, ApiRequest& r, const RequestLimits& lim) {
  SamplingParams& s = r.sampling;
  if (present(body, "temperature")) s.temperature = float(get_number(body, "temperature", 0.0, 2.0));
  if (present(body, "top_p")) s.top_p = float(get_number(body, "top_p", 0.0, 1.0, /*lo_open=*/true));
  if (present(body, "top_k")) {
    int64_t k = get_int(body, "top_k", -1, int64_t(1) << 31);
    s.top_k = k <= 0 ? 0 : static_cast<int>(std::min<int64_t>(k, lim.vocab_size > 0 ? lim.vocab_size : k));
  }
  if (present(body, "min_p")) s.min_p = float(get_number(body, "min_p", 0.0, 1.0));
  if (present(body, "presence_penalty")) s.presence_penalty = float(get_number(body, "presence_penalty", -2.0, 2.0));
  if (present(body, "frequency_penalty"))
    s.frequency_penalty = float(get_number(body, "frequency_penalty", -2.0, 2.0));
  if (present(body, "repetition_penalty"))
    s.repetition_penalty = float(get_number(body, "repetition_penalty", 0.0, 10.0, /*lo_open=*/true));
  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (v.is_number_unsigned()) s.seed = v.get<uint64_t>();
    else if (v.is_number_integer()) throw bad_request("'seed' must be between 0 and 2^64-1", "seed");
    else wrong_type("seed", "an integer", v);
  }
  if (present(body, "logit_bias")) {
    const json& lb = body["logit_bias"];
    if (!lb.is_object()) wrong_type("logit_bias", "an object mapping token ids to biases", lb);
    if (lb.size() > lim.max_logit_bias)
      throw bad_request(fmt::format("'logit_bias' may hold at most {} entries", lim.max_logit_bias), "logit_bias");
    for (auto& [k, v] : lb.items()) {
      char* end = nullptr;
      long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || (lim.vocab_size > 0 && id >= lim.vocab_size))
        throw bad_request(fmt::format("'logit_bias' keys must be token ids below {}", lim.vocab_size), "logit_bias");
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
        throw bad_request("'logit_bias' values must be numbers between -100 and 100", "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
    }
  }
}

void parse_common(const json& body, ApiRequest& r, const RequestLimits& lim) {
  if (present(body, "model")) {
    if (!body["model"].is_string()) wrong_type("model", "a string", body["model"]);
    r.model = body["model"].get<std::string>();
  }
  if (present(body, "stream")) r.stream = get_bool(body, "stream");
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) wrong_type("stream_options", "an object", so);
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) wrong_type("stream_options.include_usage", "a boolean", so["include_usage"]);
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  // max_completion_tokens wins over the deprecated max_tokens. Values past the context are clamped later.
  const int64_t big = std::numeric_limits<int64_t>::max();
  if (present(body, "max_tokens")) r.max_tokens = get_int(body, "max_tokens", 1, big);
  if (present(body, "max_completion_tokens")) r.max_tokens = get_int(body, "max_completion_tokens", 1, big);
  if (present(body, "n")) {
    int64_t n = get_int(body, "n", 1, big);
    if (n != 1) throw bad_request("only n = 1 is supported", "n");
  }
  if (present(body, "best_of") && get_int(body, "best_of", 1, big) != 1)
    throw bad_request("only best_of = 1 is supported", "best_of");
  if (present(body, "stop")) {
    const json& st = body["stop"];
    if (st.is_string()) {
      r.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      if (st.size() > lim.max_stop)
        throw bad_request(fmt::format("at most {} stop sequences are allowed", lim.max_stop), "stop");
      for (const auto& x : st) {
        if (!x.is_string()) throw bad_request("'stop' must be a string or an array of strings", "stop");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", st);
    }
    for (const auto& s : r.stop)
      if (s.size() > lim.max_stop_bytes)
        throw bad_request(fmt::format("stop sequences may be at most {} bytes", lim.max_stop_bytes), "stop");
  }
  // Chat: `logprobs: true` (with `top_logprobs` alternatives, 0 by default). The completions endpoint's older form
  // (an integer, with text offsets) is not offered. `top_logprobs` without `logprobs` is validated and ignored.
  bool want_logprobs = false;
  if (present(body, "logprobs")) {
    const json& lp = body["logprobs"];
    if (!lp.is_boolean() && !lp.is_number_integer()) wrong_type("logprobs", r.chat ? "a boolean" : "an integer", lp);
    want_logprobs = lp.is_boolean() ? lp.get<bool>() : lp.get<int64_t>() != 0;
    if (want_logprobs && !r.chat)
      throw bad_request("logprobs are supported on /v1/chat/completions only", "logprobs");
    if (want_logprobs && !lp.is_boolean()) wrong_type("logprobs", "a boolean", lp);
  }
  const int64_t top_logprobs = present(body, "top_logprobs") ? get_int(body, "top_logprobs", 0, 20) : 0;
  if (want_logprobs) r.top_logprobs = static_cast<int>(top_logprobs);
  if (present(body, "echo") && get_bool(body, "echo")) throw bad_request("echo is not supported", "echo");
  if (present(body, "response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      throw bad_request("'response_format' must be an object with a 'type'", "response_format");
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      r.json_schema = JsonSchema::any_object();
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
        throw bad_request("'response_format.json_schema' must be an object with a 'schema'",
                          "response_format.json_schema");
      const json& js = rf["json_schema"];
      if (!js.contains("schema") || !(js["schema"].is_object() || js["schema"].is_boolean()))
        throw bad_request("'response_format.json_schema.schema' must be a JSON Schema object",
                          "response_format.json_schema.schema");
      try {
        r.json_schema = JsonSchema::compile(js["schema"]);
      } catch (const fern::InternalError&) {
        throw;
      } catch (const Error& e) {
        throw bad_request(std::string("response_format.json_schema.") + e.what(), "response_format.json_schema.schema");
      }
    } else if (type != "text") {
      throw bad_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                        "response_format.type");
    }
  }
  if (present(body, "prompt_cache_key")) {
    if (!body["prompt_cache_key"].is_string()) wrong_type("prompt_cache_key", "a string", body["prompt_cache_key"]);
    r.cache_key = body["prompt_cache_key"].get<std::string>();
  }
  if (present(body, "ignore_eos")) r.ignore_eos = get_bool(body, "ignore_eos");
  parse_sampling(body, r, lim);
  if (lim.allow_forced_output && present(body, "test_forced_output")) {
    if (!body["test_forced_output"].is_string())
      wrong_type("test_forced_output", "a string", body["test_forced_output"]);
    r.forced_output = body["test_forced_output"].get<std::string>();
  }
}

void parse_chat_extras(const json& body, ApiRequest& r) {
  if (present(body, "parallel_tool_calls")) r.parallel_tool_calls = get_bool(body, "parallel_tool_calls");
  if (present(body, "reasoning_effort")) {
    const json& e = body["reasoning_effort"];
    static const std::set<std::string> ok = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (!e.is_string() || !ok.count(e.get<std::string>()))
      throw bad_request("'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh", "reasoning_effort");
    if (e == "none") r.enable_thinking = false;
  }
  if (present(body, "chat_template_kwargs")) {
    const json& k = body["chat_template_kwargs"];
    if (!k.is_object()) wrong_type("chat_template_kwargs", "an object", k);
    if (k.contains("enable_thinking") && !k["enable_thinking"].is_null()) {
      if (!k["enable_thinking"].is_boolean())
        wrong_type("chat_template_kwargs.enable_thinking", "a boolean", k["enable_thinking"]);
      r.enable_thinking = k["enable_thinking"].get<bool>();
    }
    if (k.contains("preserve_thinking") && !k["preserve_thinking"].is_null()) {
      if (!k["preserve_thinking"].is_boolean())
        wrong_type("chat_template_kwargs.preserve_thinking", "a boolean", k["preserve_thinking"]);
      r.preserve_thinking = k["preserve_thinking"].get<bool>();
    }
  }
}

void parse_prompt(const json& body, ApiRequest& r, const RequestLimits& lim) {
  if (!body.contains("prompt")) throw bad_request("'prompt' is required", "prompt");
  const json& p = body["prompt"];
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompt_is_tokens = true;
    for (const auto& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || (lim.vocab_size > 0 && t.get<int64_t>() >= lim.vocab_size))
        throw bad_request(fmt::format("'prompt' token ids must be integers below {}", lim.vocab_size), "prompt");
      r.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else if (p.is_array() && p.size() > 1) {
    throw bad_request("only one prompt per request is supported", "prompt");
  } else {
    wrong_type("prompt", "a string", p);
  }
  if (!r.prompt_is_tokens && r.prompt.empty()) throw bad_request("'prompt' must not be empty", "prompt");
}

}  // namespace

int json_nesting_depth(const std::string& text) {
  int depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return max_depth;
}

namespace {

template <class J>
J parse_object(const std::string& body, const RequestLimits& lim) {
  if (body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  if (json_nesting_depth(body) > lim.max_json_depth)
    throw bad_request(fmt::format("the request JSON is nested deeper than {} levels", lim.max_json_depth));
  J j;
  try {
    j = J::parse(body);
  } catch (const typename J::parse_error& e) {
    // The byte offset, not the parser's text: that would echo raw (possibly invalid UTF-8) request bytes.
    throw bad_request(fmt::format("the request body is not valid JSON (error at byte {})", e.byte));
  }
  if (!j.is_object()) throw bad_request(fmt::format("the request body must be a JSON object, not {}", type_name(j)));
  return j;
}

}  // namespace

nlohmann::ordered_json parse_json_object(const std::string& body, const RequestLimits& lim) {
  return parse_object<nlohmann::ordered_json>(body, lim);
}

ApiRequest parse_request(const std::string& body, bool chat, const RequestLimits& lim) {
  const json j = parse_object<json>(body, lim);
  ApiRequest r;
  r.chat = chat;
  if (chat) {
    r.messages = check_messages(j);
    r.tools = check_tools(j, lim);
    parse_tool_choice(j, r);
    parse_chat_extras(j, r);
  } else {
    parse_prompt(j, r, lim);
  }
  parse_common(j, r, lim);
  static const std::set<std::string> known = {
      "model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n",
      "best_of", "stop", "logprobs", "top_logprobs", "echo", "response_format", "prompt_cache_key", "ignore_eos",
      "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
      "seed", "logit_bias", "test_forced_output", "tools", "tool_choice", "parallel_tool_calls",
      "reasoning_effort", "chat_template_kwargs"};
  for (auto& [k, v] : j.items())
    if (!known.count(k)) log::debug("request field '{}' is ignored", k.size() > 64 ? k.substr(0, 64) : k);
  return r;
}

}  // namespace fern::server
