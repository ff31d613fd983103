// Pieces shared by the chat renderers (internal).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "tokenizer/chat_format.h"

namespace fern::chat {

using ojson = nlohmann::ordered_json;

// Text of a message's content: a string, null/absent (""), or a list of {"type":"text","text":...} parts joined.
// Images, videos and anything else are a fern::Error naming the message.
std::string content_text(const ojson& msg, size_t index);
// The role string of message `index` (fern::Error when missing or not a string).
const std::string& role_of(const ojson& msg, size_t index);
// Tool-call arguments as an object in the order written: OpenAI sends a JSON string, some clients an object.
ojson arguments_object(const ojson& fn, size_t msg_index, size_t call_index);
// {"name", "arguments"} of a tool call, whether given as {"function": {...}} or directly.
const ojson& call_function(const ojson& call, size_t msg_index, size_t call_index);

// out += a; out += b; ... (chained operator+ on temporaries trips a false -Wrestrict in GCC 12).
template <typename... T>
void put(std::string& out, const T&... parts) {
  (out.append(std::string_view(parts)), ...);
}

std::string render_qwen35(const ojson& messages, const ojson& tools, const ChatOptions& opt);
std::string render_qwen3(const ojson& messages, const ojson& tools, const ChatOptions& opt);

}  // namespace fern::chat
