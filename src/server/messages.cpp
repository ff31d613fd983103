// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API over the same engine, so that clients
// written for it (agents, the official SDKs) work unchanged. A request is translated into the chat request the
// OpenAI endpoint takes (system prompt, text, tool calls and tool results, thinking), validated and queued the same
// way, and the output parser's deltas go back as Anthropic content blocks (thinking, text, tool_use), whole or as
// the SSE events of a stream.
#include "server/anthropic_request.h"
#include "server/connection_watch.h"
#include "server/output_shaper.h"
#include "server/server_impl.h"

namespace fern::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// The finished message's content blocks from the chat message of the output parser.
json content_blocks(const json& msg) {
  json blocks = json::array();
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string() &&
      !msg["reasoning_content"].get<std::string>().empty())
    blocks.push_back({{"type", "thinking"}, {"thinking", msg["reasoning_content"]}, {"signature", ""}});
  if (msg.contains("content") && msg["content"].is_string() && !msg["content"].get<std::string>().empty())
    blocks.push_back({{"type", "text"}, {"text", msg["content"]}});
  if (msg.contains("tool_calls"))
    for (const auto& tc : msg["tool_calls"]) {
      json input = json::parse(tc["function"].value("arguments", "{}"), nullptr, /*allow_exceptions=*/false);
      if (!input.is_object()) input = json::object();
      blocks.push_back({{"type", "tool_use"}, {"id", tc["id"]}, {"name", tc["function"]["name"]}, {"input", input}});
    }
  return blocks;
}

std::string stop_reason(const GenerateResult& r, bool tool_calls) {
  if (r.finish != FinishReason::Stop) return "max_tokens";
  if (tool_calls) return "tool_use";
  return r.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json stop_sequence(const GenerateResult& r) {
  return r.finish == FinishReason::Stop && !r.stop_sequence.empty() ? json(r.stop_sequence) : json(nullptr);
}

json usage(const GenerateResult& r) {
  return {{"input_tokens", r.prompt_tokens - r.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", r.cached_tokens},
          {"output_tokens", r.completion_tokens}};
}

std::string event(const char* name, const json& data) {
  return std::string("event: ") + name + "\ndata: " + dump_json(data) + "\n\n";
}

// The stream's content blocks as the parser's deltas open and extend them.
struct BlockStream {
  int index = -1;
  std::string open;  // "", "thinking", "text", "tool_use"
  // Events for one delta object of the output shaper.
  std::string push(const json& d) {
    std::string out;
    auto start = [&](const std::string& type, const json& block) {
      out += close();
      open = type;
      ++index;
      out += event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    };
    auto delta = [&](const json& dl) {
      out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index}, {"delta", dl}});
    };
    if (d.contains("reasoning_content")) {
      if (open != "thinking") start("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      delta({{"type", "thinking_delta"}, {"thinking", d["reasoning_content"]}});
    }
    if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty()) {
      if (open != "text") start("text", {{"type", "text"}, {"text", ""}});
      delta({{"type", "text_delta"}, {"text", d["content"]}});
    }
    if (d.contains("tool_calls"))
      for (const auto& tc : d["tool_calls"]) {
        if (tc.contains("id"))
          start("tool_use", {{"type", "tool_use"}, {"id", tc["id"]}, {"name", tc["function"]["name"]}, {"input", json::object()}});
        const std::string args = tc.contains("function") ? tc["function"].value("arguments", "") : "";
        if (!args.empty()) delta({{"type", "input_json_delta"}, {"partial_json", args}});
      }
    return out;
  }
  std::string close() {
    if (open.empty()) return "";
    open.clear();
    return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
  }
};

// The Messages stream: message_start, the content blocks' events, message_delta, message_stop.
class MessageEvents : public EventSource {
 public:
  MessageEvents(OutputShaper shaper, std::string id, std::string model, int64_t prompt_tokens)
      : shaper_(std::move(shaper)), id_(std::move(id)), model_(std::move(model)), prompt_tokens_(prompt_tokens) {}
  std::string start() override {
    return event("message_start", {{"type", "message_start"},
                                   {"message",
                                    {{"id", id_},
                                     {"type", "message"},
                                     {"role", "assistant"},
                                     {"model", model_},
                                     {"content", json::array()},
                                     {"stop_reason", nullptr},
                                     {"stop_sequence", nullptr},
                                     {"usage", {{"input_tokens", prompt_tokens_}, {"output_tokens", 0}}}}}});
  }
  std::string output(const std::string& text, std::vector<TokenLogprob>&) override {
    std::string out;
    for (const auto& d : shaper_.push(text)) out += blocks_.push(d);
    return out;
  }
  std::string finish(const GenerateResult& r, std::vector<TokenLogprob>&) override {
    std::string out;
    for (const auto& d : shaper_.finish()) out += blocks_.push(d);
    out += blocks_.close();
    const json delta = {{"type", "message_delta"},
                        {"delta", {{"stop_reason", stop_reason(r, shaper_.has_tool_calls())}, {"stop_sequence", stop_sequence(r)}}},
                        {"usage", usage(r)}};
    return out + event("message_delta", delta) + event("message_stop", {{"type", "message_stop"}});
  }
  std::string failure(const std::string& message) override {
    return event("error", anthropic_error_json(ApiError(500, "server_error", message)));
  }
  std::string keep_alive() override { return event("ping", {{"type", "ping"}}); }

 private:
  OutputShaper shaper_;
  std::string id_, model_;
  int64_t prompt_tokens_;
  BlockStream blocks_;
};

}  // namespace

void Server::Impl::handle_messages(const httplib::Request& req, httplib::Response& res, bool count_only) {
  try {
    admit(req, /*json_body=*/true);
    ojson a = parse_json_object(req.body, limits);
    if (count_only && !a.contains("max_tokens")) a["max_tokens"] = 1;  // not needed to count
    // Any model name is served by the one model (clients written for the API send their own names).
    const std::string body = chat_from_anthropic(a).dump();
    const ApiRequest ar = parse_request(body, true, limits);
    if (count_only) {
      const Prepared p = prepare(ar, body, true);
      send_json(res, 200, {{"input_tokens", int64_t(p.gen.prompt.size())}});
      metrics.request_done(200);
      return;
    }
    Submitted sub = submit(ar, body, true);
    const int64_t n_prompt = int64_t(sub.job->gen.prompt.size());
    const std::string id = random_id("msg_");
    OutputShaper shaper(sub.prep.parser, ar.parallel_tool_calls, sub.prep.detect_think);
    ConnectionWatch watch(req.remote_addr, req.remote_port, req.local_port);

    if (!ar.stream) {
      OpenRequest done{open_requests};
      const std::optional<GenerateResult> result = collect(*sub.job, shaper, watch);
      if (!result) return;
      const GenerateResult& r = *result;
      const json body_out = {{"id", id},
                             {"type", "message"},
                             {"role", "assistant"},
                             {"model", rt.model_id},
                             {"content", content_blocks(shaper.message())},
                             {"stop_reason", stop_reason(r, shaper.has_tool_calls())},
                             {"stop_sequence", stop_sequence(r)},
                             {"usage", usage(r)}};
      send_json(res, 200, body_out);
      metrics.request_done(200);
      return;
    }

    stream_job(res, sub.job, watch, std::make_shared<MessageEvents>(std::move(shaper), id, rt.model_id, n_prompt));
  } catch (...) {
    answer_exception(res, /*anthropic=*/true);
  }
}

}  // namespace fern::server
