// Renders chat prompts byte for byte as the Qwen3.5 / Qwen3.6 chat templates do (MODEL.md section 5), and the
// Qwen3 template of the reference tokenizer package.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fern {

enum class ChatTemplateKind { Qwen35, Qwen36, Qwen3 };

struct ChatOptions {
  ChatTemplateKind kind = ChatTemplateKind::Qwen36;
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  bool preserve_thinking = false;  // Qwen3.6 only
};

// messages: OpenAI-style array of {"role", "content" (string | array of parts | null), "reasoning_content",
// "tool_calls": [{"id","type","function":{"name","arguments" (JSON string or object)}}], "tool_call_id"}.
// tools: OpenAI-style array (or null). Throws fern::Error for unsupported content (images) or malformed input.
// Keys of nlohmann::json objects are sorted, so tool schemas and argument objects given this way render with
// sorted keys; the templates keep insertion order, which the ordered_json overload preserves (prefer it).
std::string render_chat(const nlohmann::json& messages, const nlohmann::json& tools, const ChatOptions& opt);
std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        const ChatOptions& opt);

// The same prompt, plus the byte ranges that came from the request (message contents, reasoning, tool names,
// arguments and schemas). Encode it with Tokenizer::encode_marked so that a user who types "<|im_start|>" gets
// text, not the control token (RELIABILITY.md T27); the ids are otherwise those of encode(text).
struct RenderedChat {
  std::string text;
  std::vector<TextSpan> literal;
};
RenderedChat render_chat_marked(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                const ChatOptions& opt);

}  // namespace fern
