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

// The prompt being built: template text, and the spans of text that came from the request.
struct Out {
  RenderedChat r;
  Out& operator+=(std::string_view s) {
    r.text.append(s);
    return *this;
  }
};
// Marks a part as request text.
struct Lit {
  std::string_view s;
};
inline void put_one(Out& o, std::string_view s) { o.r.text.append(s); }
inline void put_one(Out& o, Lit l) {
  if (l.s.empty()) return;
  const size_t b = o.r.text.size();
  o.r.text.append(l.s);
  if (!o.r.literal.empty() && o.r.literal.back().end == b)
    o.r.literal.back().end = o.r.text.size();
  else
    o.r.literal.push_back({b, o.r.text.size()});
}
// out += a; out += b; ... (also avoids chained operator+ on temporaries, which trips a false -Wrestrict in GCC 12).
template <typename... T>
void put(Out& out, const T&... parts) {
  (put_one(out, parts), ...);
}

RenderedChat render_qwen35(const ojson& messages, const ojson& tools, const ChatOptions& opt);
RenderedChat render_qwen3(const ojson& messages, const ojson& tools, const ChatOptions& opt);

}  // namespace fern::chat
