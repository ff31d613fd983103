// POST /v1/responses: the OpenAI Responses API over the same engine (clients and agent SDKs that default to it work
// unchanged). A request is translated into the chat request (responses_request.h), queued the same way, and the
// output parser's deltas go back as output items (reasoning, message, function_call), whole or as the stream's
// typed events. Responses are kept (`store`, the default) as their conversation's chat messages, so that a request
// with previous_response_id continues one without sending it again; the store holds the most recent 256 (at most
// 256 MiB of them).
#include <ctime>

#include "server/connection_watch.h"
#include "server/output_shaper.h"
#include "server/responses_request.h"
#include "server/server_impl.h"

namespace fern::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

void ResponseStore::put(const std::string& id, ojson messages) {
  const size_t bytes = messages.dump().size();
  std::lock_guard lk(mu_);
  order_.push_back(id);
  bytes_ += bytes;
  by_id_[id] = Entry{std::move(messages), bytes};
  while (order_.size() > kCapacity || (bytes_ > kMaxBytes && order_.size() > 1)) {
    auto it = by_id_.find(order_.front());
    bytes_ -= it->second.bytes;
    by_id_.erase(it);
    order_.pop_front();
  }
}

std::optional<ojson> ResponseStore::get(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second.messages;
}

namespace {

// The reply as one chat message (what the next turn of the conversation sends back).
ojson reply_message(const json& msg) {
  ojson m = {{"role", "assistant"}, {"content", msg.value("content", json()).is_string() ? msg["content"] : json("")}};
  if (msg.contains("reasoning_content")) m["reasoning_content"] = msg["reasoning_content"];
  if (msg.contains("tool_calls")) {
    m["tool_calls"] = ojson::parse(msg["tool_calls"].dump());
    if (m["content"] == "") m["content"] = nullptr;
  }
  return m;
}

// The output items of a finished reply; ids as the stream names them (`id`: the response id's suffix).
json output_items(const json& msg, const std::string& id) {
  json items = json::array();
  auto item_id = [&](const char* prefix) { return prefix + id + "_" + std::to_string(items.size()); };
  if (msg.contains("reasoning_content") && !msg["reasoning_content"].get<std::string>().empty())
    items.push_back({{"type", "reasoning"},
                     {"id", item_id("rs_")},
                     {"summary", json::array()},
                     {"content", {{{"type", "reasoning_text"}, {"text", msg["reasoning_content"]}}}}});
  if (msg.contains("content") && msg["content"].is_string() && !msg["content"].get<std::string>().empty())
    items.push_back({{"type", "message"},
                     {"id", item_id("msg_")},
                     {"status", "completed"},
                     {"role", "assistant"},
                     {"content", {{{"type", "output_text"}, {"text", msg["content"]}, {"annotations", json::array()}}}}});
  if (msg.contains("tool_calls"))
    for (const auto& tc : msg["tool_calls"])
      items.push_back({{"type", "function_call"},
                       {"id", "fc_" + tc["id"].get<std::string>()},
                       {"call_id", tc["id"]},
                       {"name", tc["function"]["name"]},
                       {"arguments", tc["function"]["arguments"]},
                       {"status", "completed"}});
  return items;
}

json usage_of(const GenerateResult& r, int32_t think_end_id, bool thinking) {
  int64_t reasoning = 0;
  if (thinking) reasoning = std::find(r.output.begin(), r.output.end(), think_end_id) - r.output.begin();
  return {{"input_tokens", r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", r.cached_tokens}}},
          {"output_tokens", r.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", reasoning}}},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

// The response object; `done` false: the in-progress one a stream starts with.
struct ResponseHead {
  std::string id, model;
  int64_t created = 0;
  ojson request;  // echoed fields
};

json response_json(const ResponseHead& h, const char* status, const json& output, const json& usage,
                   bool incomplete) {
  auto echo = [&](const char* k, json dflt) { return h.request.contains(k) ? json::parse(h.request[k].dump()) : dflt; };
  json r = {{"id", h.id},
            {"object", "response"},
            {"created_at", h.created},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", incomplete ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"instructions", echo("instructions", nullptr)},
            {"max_output_tokens", echo("max_output_tokens", nullptr)},
            {"model", h.model},
            {"output", output},
            {"parallel_tool_calls", echo("parallel_tool_calls", true)},
            {"previous_response_id", echo("previous_response_id", nullptr)},
            {"reasoning", echo("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
            {"store", echo("store", true)},
            {"temperature", echo("temperature", 1.0)},
            {"text", echo("text", json{{"format", {{"type", "text"}}}})},
            {"tool_choice", echo("tool_choice", "auto")},
            {"tools", echo("tools", json::array())},
            {"top_p", echo("top_p", 1.0)},
            {"truncation", "disabled"},
            {"metadata", echo("metadata", json::object())},
            {"usage", usage}};
  return r;
}

// The stream's output items as the parser's deltas open and extend them; every event numbered.
struct ItemStream {
  std::string id;
  int64_t seq = 0;
  int index = -1;
  std::string open;  // "", "reasoning", "message", "function_call"
  json item;         // the open item as it stands
  std::string text;  // its text or arguments so far

  std::string event(const char* type, json data) {
    data["type"] = type;
    data["sequence_number"] = seq++;
    return std::string("event: ") + type + "\ndata: " + dump_json(data) + "\n\n";
  }
  std::string start(const std::string& kind, json it) {
    std::string out = close();
    open = kind;
    ++index;
    text.clear();
    item = std::move(it);
    out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    if (kind == "message")
      out += event("response.content_part.added",
                   {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    if (kind == "reasoning")
      out += event("response.content_part.added", {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0},
                                                   {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
    return out;
  }
  std::string push(const json& d) {
    std::string out;
    const std::string n = std::to_string(index + 1);  // the output index of an item started here
    if (d.contains("reasoning_content")) {
      if (open != "reasoning")
        out += start("reasoning", {{"type", "reasoning"}, {"id", "rs_" + id + "_" + n}, {"summary", json::array()},
                                   {"content", json::array()}});
      text += d["reasoning_content"].get<std::string>();
      out += event("response.reasoning_text.delta",
                   {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"delta", d["reasoning_content"]}});
    }
    if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty()) {
      if (open != "message")
        out += start("message", {{"type", "message"}, {"id", "msg_" + id + "_" + n}, {"status", "in_progress"},
                                 {"role", "assistant"}, {"content", json::array()}});
      text += d["content"].get<std::string>();
      out += event("response.output_text.delta", {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0},
                                                  {"delta", d["content"]}, {"logprobs", json::array()}});
    }
    if (d.contains("tool_calls"))
      for (const auto& tc : d["tool_calls"]) {
        if (tc.contains("id"))
          out += start("function_call", {{"type", "function_call"}, {"id", "fc_" + tc["id"].get<std::string>()},
                                         {"call_id", tc["id"]}, {"name", tc["function"]["name"]}, {"arguments", ""},
                                         {"status", "in_progress"}});
        const std::string args = tc.contains("function") ? tc["function"].value("arguments", "") : "";
        if (!args.empty()) {
          text += args;
          out += event("response.function_call_arguments.delta",
                       {{"item_id", item["id"]}, {"output_index", index}, {"delta", args}});
        }
      }
    return out;
  }
  std::string close() {
    if (open.empty()) return "";
    std::string out;
    if (open == "message") {
      const json part = {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
      out += event("response.output_text.done",
                   {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text}});
      out += event("response.content_part.done",
                   {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
      item["content"] = json::array({part});
      item["status"] = "completed";
    } else if (open == "reasoning") {
      out += event("response.reasoning_text.done",
                   {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text}});
      item["content"] = json::array({{{"type", "reasoning_text"}, {"text", text}}});
    } else {
      out += event("response.function_call_arguments.done",
                   {{"item_id", item["id"]}, {"output_index", index}, {"arguments", text}});
      item["arguments"] = text;
      item["status"] = "completed";
    }
    out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
    open.clear();
    return out;
  }
};

// The Responses stream: response.created / in_progress, the output items' events, response.completed (or
// incomplete). The finished conversation goes to the store.
class ResponseEvents : public EventSource {
 public:
  ResponseEvents(OutputShaper shaper, ResponseHead head, bool thinking, int32_t think_end_id, ResponseStore* store,
                 ojson conversation)
      : shaper_(std::move(shaper)), head_(std::move(head)), thinking_(thinking), think_end_id_(think_end_id),
        store_(store), conversation_(std::move(conversation)) {
    items_.id = head_.id.substr(5);
  }
  std::string start() override {
    const json r0 = response_json(head_, "in_progress", json::array(), nullptr, false);
    return items_.event("response.created", {{"response", r0}}) + items_.event("response.in_progress", {{"response", r0}});
  }
  std::string output(const std::string& text, std::vector<TokenLogprob>&) override {
    std::string out;
    for (const auto& d : shaper_.push(text)) out += items_.push(d);
    return out;
  }
  std::string finish(const GenerateResult& g, std::vector<TokenLogprob>&) override {
    std::string out;
    for (const auto& d : shaper_.finish()) out += items_.push(d);
    out += items_.close();
    const json msg = shaper_.message();
    const bool incomplete = g.finish != FinishReason::Stop;
    if (store_) {
      conversation_.push_back(reply_message(msg));
      store_->put(head_.id, std::move(conversation_));
    }
    const json r = response_json(head_, incomplete ? "incomplete" : "completed", output_items(msg, items_.id),
                                 usage_of(g, think_end_id_, thinking_ || shaper_.thinking()), incomplete);
    return out + items_.event(incomplete ? "response.incomplete" : "response.completed", {{"response", r}});
  }
  std::string failure(const std::string& message) override {
    return items_.event("error", {{"code", "server_error"}, {"message", message}, {"param", nullptr}});
  }

 private:
  OutputShaper shaper_;
  ResponseHead head_;
  bool thinking_;
  int32_t think_end_id_;
  ResponseStore* store_;  // null: store false
  ojson conversation_;
  ItemStream items_;
};

}  // namespace

void Server::Impl::handle_responses(const httplib::Request& req, httplib::Response& res) {
  try {
    admit(req, /*json_body=*/false);
    const ojson r = parse_json_object(req.body, limits);
    if (r.contains("model") && r["model"].is_string() && r["model"] != rt.model_id)
      throw model_not_found(r["model"].get<std::string>());
    std::optional<ojson> history;
    if (r.contains("previous_response_id") && !r["previous_response_id"].is_null()) {
      if (!r["previous_response_id"].is_string())
        throw bad_request("previous_response_id must be a string", "previous_response_id");
      history = responses->get(r["previous_response_id"].get<std::string>());
      if (!history)
        throw ApiError(404, "not_found_error", "no stored response with that id (the store keeps the latest 256)",
                       "previous_response_id", "response_not_found");
    }
    const ojson chat = chat_from_responses(r, history ? &*history : nullptr);
    const std::string body = chat.dump();
    const ApiRequest ar = parse_request(body, true, limits);
    Submitted sub = submit(ar, body, true);
    ResponseHead head{random_id("resp_"), rt.model_id, static_cast<int64_t>(std::time(nullptr)), r};
    const bool store = !r.contains("store") || r["store"] != false;
    // The conversation as the next turn continues it: the messages without the instructions (not carried over).
    ojson conversation = ojson::array();
    const ojson& all = chat["messages"];
    for (size_t i = r.contains("instructions") && !r["instructions"].is_null() ? 1 : 0; i < all.size(); ++i)
      conversation.push_back(all[i]);
    OutputShaper shaper(sub.prep.parser, ar.parallel_tool_calls, sub.prep.detect_think);
    ConnectionWatch watch(req.remote_addr, req.remote_port, req.local_port);

    if (!ar.stream) {
      OpenRequest done{open_requests};
      const std::optional<GenerateResult> result = collect(*sub.job, shaper, watch);
      if (!result) return;
      const GenerateResult& g = *result;
      const json msg = shaper.message();
      const bool incomplete = g.finish != FinishReason::Stop;
      if (store) {
        conversation.push_back(reply_message(msg));
        responses->put(head.id, std::move(conversation));
      }
      send_json(res, 200,
                response_json(head, incomplete ? "incomplete" : "completed", output_items(msg, head.id.substr(5)),
                              usage_of(g, think_end_id, sub.prep.thinking || shaper.thinking()), incomplete));
      metrics.request_done(200);
      return;
    }

    stream_job(res, sub.job, watch,
               std::make_shared<ResponseEvents>(std::move(shaper), head, sub.prep.thinking, think_end_id,
                                                store ? responses.get() : nullptr, std::move(conversation)));
  } catch (...) {
    answer_exception(res);
  }
}

}  // namespace fern::server
