// Qwen3.5 / Qwen3.6 prompts (MODEL.md 5.1-5.4), rule for rule as the released chat template renders them.
#include "tokenizer/chat_format.h"

#include "core/error.h"
#include "tokenizer/chat_common.h"
#include "tokenizer/py_format.h"

namespace fern {
namespace chat {

const std::string& role_of(const ojson& msg, size_t index) {
  if (!msg.is_object()) fail("messages[{}]: must be an object", index);
  auto it = msg.find("role");
  if (it == msg.end() || !it->is_string()) fail("messages[{}]: \"role\" must be a string", index);
  return it->get_ref<const std::string&>();
}

std::string content_text(const ojson& msg, size_t index) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) fail("messages[{}].content: must be a string, an array of parts or null", index);
  std::string out;
  for (size_t k = 0; k < it->size(); ++k) {
    const ojson& part = (*it)[k];
    if (!part.is_object()) fail("messages[{}].content[{}]: must be an object", index, k);
    auto ty = part.find("type");
    if (ty != part.end() && !ty->is_string()) fail("messages[{}].content[{}].type: must be a string", index, k);
    const std::string type = ty != part.end() ? ty->get<std::string>() : "";
    if (part.contains("image") || part.contains("image_url") || type == "image" || type == "image_url" ||
        part.contains("video") || type == "video" || type == "input_audio")
      fail("messages[{}].content[{}]: {} content is not supported (text only)", index, k,
           type.empty() ? "image/video" : type);
    auto t = part.find("text");
    if (t == part.end()) fail("messages[{}].content[{}]: unexpected content part (no \"text\")", index, k);
    if (!t->is_string()) fail("messages[{}].content[{}].text: must be a string", index, k);
    out += t->get_ref<const std::string&>();
  }
  return out;
}

const ojson& call_function(const ojson& call, size_t mi, size_t ci) {
  if (!call.is_object()) fail("messages[{}].tool_calls[{}]: must be an object", mi, ci);
  auto f = call.find("function");
  const ojson& fn = f != call.end() ? *f : call;
  if (!fn.is_object()) fail("messages[{}].tool_calls[{}].function: must be an object", mi, ci);
  auto name = fn.find("name");
  if (name == fn.end() || !name->is_string())
    fail("messages[{}].tool_calls[{}]: function \"name\" must be a string", mi, ci);
  return fn;
}

ojson arguments_object(const ojson& fn, size_t mi, size_t ci) {
  auto a = fn.find("arguments");
  if (a == fn.end() || a->is_null()) return ojson::object();
  if (a->is_object()) return *a;
  if (a->is_string()) {
    const std::string& s = a->get_ref<const std::string&>();
    if (py::strip(s).empty()) return ojson::object();
    ojson parsed = ojson::parse(s, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object())
      fail("messages[{}].tool_calls[{}].function.arguments: not a JSON object", mi, ci);
    return parsed;
  }
  fail("messages[{}].tool_calls[{}].function.arguments: must be a JSON object or a string holding one", mi, ci);
}

namespace {

constexpr const char* kToolsIntro = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr const char* kToolsInstructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer "
    "the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>";

std::string trimmed_content(const ojson& msg, size_t i) { return std::string(py::strip(content_text(msg, i))); }

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Qwen3.5: containers as JSON, everything else as Python str(). Qwen3.6: strings raw, everything else as JSON.
std::string argument_value(const ojson& v, ChatTemplateKind kind) {
  if (kind == ChatTemplateKind::Qwen36) return v.is_string() ? v.get<std::string>() : py::dumps(v);
  return v.is_object() || v.is_array() ? py::dumps(v) : py::str(v);
}

void render_assistant(const ojson& m, size_t i, bool keep_reasoning, const ChatOptions& opt, Out& out) {
  std::string content = trimmed_content(m, i);
  std::string reasoning;
  auto rc = m.find("reasoning_content");
  if (rc != m.end() && rc->is_string()) {
    reasoning = rc->get<std::string>();
  } else if (content.find("</think>") != std::string::npos) {
    // reasoning: before the first </think>, newlines stripped on the right, after the last <think>, newlines
    // stripped on the left; content: after the last </think>, newlines stripped on the left.
    std::string_view before = std::string_view(content).substr(0, content.find("</think>"));
    before = py::strip_chars(before, "\n", false, true);
    const size_t open = before.rfind("<think>");
    if (open != std::string_view::npos) before = before.substr(open + 7);
    reasoning = std::string(py::strip_chars(before, "\n", true, false));
    content = std::string(py::strip_chars(std::string_view(content).substr(content.rfind("</think>") + 8), "\n",
                                          true, false));
  }
  reasoning = std::string(py::strip(reasoning));
  if (keep_reasoning)
    put(out, "<|im_start|>assistant\n<think>\n", Lit{reasoning}, "\n</think>\n\n", Lit{content});
  else
    put(out, "<|im_start|>assistant\n", Lit{content});
  auto tc = m.find("tool_calls");
  if (tc != m.end() && tc->is_array()) {
    for (size_t k = 0; k < tc->size(); ++k) {
      const ojson& fn = call_function((*tc)[k], i, k);
      const std::string& name = fn["name"].get_ref<const std::string&>();
      if (k == 0)
        out += (py::strip(content).empty() ? "" : "\n\n");
      else
        out += "\n";
      put(out, "<tool_call>\n<function=", Lit{name}, ">\n");
      const ojson args = arguments_object(fn, i, k);
      for (auto it = args.begin(); it != args.end(); ++it)
        put(out, "<parameter=", Lit{it.key()}, ">\n", Lit{argument_value(it.value(), opt.kind)}, "\n</parameter>\n");
      out += "</function>\n</tool_call>";
    }
  } else if (tc != m.end() && !tc->is_null()) {
    fail("messages[{}].tool_calls: must be an array", i);
  }
  out += "<|im_end|>\n";
}

}  // namespace

RenderedChat render_qwen35(const ojson& messages, const ojson& tools, const ChatOptions& opt) {
  if (!messages.is_array()) fail("messages: must be an array");
  if (messages.empty()) fail("messages: no messages provided");
  if (!tools.is_null() && !tools.is_array()) fail("tools: must be an array");
  const size_t n = messages.size();
  for (size_t i = 0; i < n; ++i) role_of(messages[i], i);
  Out out;
  const bool first_system = role_of(messages[0], 0) == "system";
  if (tools.is_array() && !tools.empty()) {
    out += "<|im_start|>system\n";
    out += kToolsIntro;
    for (const auto& t : tools) put(out, "\n", Lit{py::dumps(t)});
    out += "\n</tools>";
    out += kToolsInstructions;
    if (first_system) {
      const std::string sys = trimmed_content(messages[0], 0);
      if (!sys.empty()) put(out, "\n\n", Lit{sys});
    }
    out += "<|im_end|>\n";
  } else if (first_system) {
    put(out, "<|im_start|>system\n", Lit{trimmed_content(messages[0], 0)}, "<|im_end|>\n");
  }
  // The last user message that is a real query (not a wrapped tool response): assistant turns after it keep their
  // reasoning.
  std::optional<size_t> last_query;
  for (size_t k = n; k-- > 0;) {
    if (role_of(messages[k], k) != "user") continue;
    const std::string c = trimmed_content(messages[k], k);
    if (!(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  if (!last_query) fail("messages: no user query found");
  for (size_t i = 0; i < n; ++i) {
    const ojson& m = messages[i];
    const std::string& role = role_of(m, i);
    if (role == "system") {
      if (i != 0) fail("messages[{}]: a system message must be the first message", i);
    } else if (role == "user") {
      put(out, "<|im_start|>user\n", Lit{trimmed_content(m, i)}, "<|im_end|>\n");
    } else if (role == "assistant") {
      const bool keep = i > *last_query || (opt.kind == ChatTemplateKind::Qwen36 && opt.preserve_thinking);
      render_assistant(m, i, keep, opt, out);
    } else if (role == "tool") {
      // Consecutive tool results share one user turn.
      if (i > 0 && role_of(messages[i - 1], i - 1) != "tool") out += "<|im_start|>user";
      put(out, "\n<tool_response>\n", Lit{trimmed_content(m, i)}, "\n</tool_response>");
      if (i + 1 == n || role_of(messages[i + 1], i + 1) != "tool") out += "<|im_end|>\n";
    } else {
      fail("messages[{}]: unexpected role \"{}\"", i, role);
    }
  }
  if (opt.add_generation_prompt)
    out += opt.enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return std::move(out.r);
}

}  // namespace chat

RenderedChat render_chat_marked(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                const ChatOptions& opt) {
  if (opt.kind == ChatTemplateKind::Qwen3) return chat::render_qwen3(messages, tools, opt);
  return chat::render_qwen35(messages, tools, opt);
}

std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        const ChatOptions& opt) {
  return render_chat_marked(messages, tools, opt).text;
}

std::string render_chat(const nlohmann::json& messages, const nlohmann::json& tools, const ChatOptions& opt) {
  return render_chat(nlohmann::ordered_json(messages), nlohmann::ordered_json(tools), opt);
}

}  // namespace fern
