// POST /v1/chat/completions and POST /v1/completions: validate, render and tokenize on the HTTP thread, queue a
// job for the engine worker, then answer in one JSON body or as an SSE stream (API.md 14.2 / 14.3).
#include <chrono>
#include <cmath>
#include <ctime>

#include "core/log.h"
#include "server/connection_watch.h"
#include "server/output_shaper.h"
#include "server/server_impl.h"
#include "tokenizer/chat_format.h"

namespace fern::server {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// The request's messages and tools in the client's key order. The chat templates serialise tool schemas and
// argument objects in insertion order, and nlohmann::json sorts keys, so the prompt is rendered from an
// ordered_json copy of the (already validated) body, with the same developer -> system mapping as parse_request.
struct OrderedChat {
  nlohmann::ordered_json messages, tools;
};

OrderedChat ordered_chat(const std::string& body, bool with_tools) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(body);
  OrderedChat c;
  c.messages = j.at("messages");
  for (auto& m : c.messages)
    if (m.at("role") == "developer") m["role"] = "system";
  if (with_tools && j.contains("tools") && !j["tools"].is_null()) c.tools = j["tools"];
  return c;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

json usage_json(const ResponseCtx& c, const GenerateResult& r) {
  int64_t reasoning = 0;
  if (c.thinking) {
    // Tokens before "</think>" are reasoning (all of them when it never came).
    auto it = std::find(r.output.begin(), r.output.end(), c.think_end_id);
    reasoning = it - r.output.begin();
  }
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning}}}};
}

std::string finish_reason(const GenerateResult& r, bool tool_calls) {
  switch (r.finish) {
    case FinishReason::Stop: return tool_calls ? "tool_calls" : "stop";
    // Cancelled here means the server ended the request (shutdown); the output was cut short.
    case FinishReason::Length:
    case FinishReason::Cancelled: return "length";
  }
  return "stop";
}

// One entry of `logprobs.content` (API.md 14.2): the token's text (raw bytes; the JSON dump replaces a partial
// UTF-8 character with U+FFFD) and its bytes, its log-probability (-9999 for -inf, which JSON cannot carry, as
// OpenAI does) and the alternatives.
json logprob_entry(const TokenLogprob& e, const Tokenizer& tok) {
  auto one = [&](int32_t id, float lp) {
    const std::string text = tok.token_text(id);
    json bytes = json::array();
    for (unsigned char b : text) bytes.push_back(int(b));
    return json{{"token", text}, {"logprob", std::isfinite(lp) ? double(lp) : -9999.0}, {"bytes", bytes}};
  };
  json entry = one(e.id, e.logprob);
  json top = json::array();
  for (const auto& [id, lp] : e.top) top.push_back(one(id, lp));
  entry["top_logprobs"] = top;
  return entry;
}

json logprob_entries(const std::vector<TokenLogprob>& entries, const Tokenizer& tok) {
  json content = json::array();
  for (const auto& e : entries) content.push_back(logprob_entry(e, tok));
  return content;
}

json chunk_json(const ResponseCtx& c, const json& delta_or_text, const json& finish, const json& logprobs = nullptr) {
  json choice = {{"index", 0}};
  if (c.chat) {
    choice["delta"] = delta_or_text;
  } else {
    choice["text"] = delta_or_text.value("text", "");
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish;
  json ch = {{"id", c.id},
             {"object", c.chat ? "chat.completion.chunk" : "text_completion"},
             {"created", c.created},
             {"model", c.model},
             {"choices", json::array({choice})}};
  if (c.include_usage) ch["usage"] = nullptr;
  return ch;
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

// The OpenAI chat / completions stream (API.md 14.3): chunks of deltas, the finish chunk, the usage chunk, [DONE].
class ChatEvents : public EventSource {
 public:
  ChatEvents(ResponseCtx rc, OutputShaper shaper, const Tokenizer* tok, bool logprobs)
      : rc_(std::move(rc)), shaper_(std::move(shaper)), tok_(tok), logprobs_(logprobs) {}
  bool wants_logprobs() const override { return logprobs_; }
  std::string start() override {
    return sse(chunk_json(rc_, rc_.chat ? json{{"role", "assistant"}, {"content", ""}} : json{{"text", ""}}, nullptr));
  }
  std::string output(const std::string& text, std::vector<TokenLogprob>& lp) override {
    std::string out;
    for (const auto& d : shaper_.push(text)) out += sse(chunk_json(rc_, d, nullptr, entries(lp)));
    return out;
  }
  std::string finish(const GenerateResult& r, std::vector<TokenLogprob>& lp) override {
    std::string out;
    for (const auto& d : shaper_.finish()) out += sse(chunk_json(rc_, d, nullptr, entries(lp)));
    rc_.thinking = shaper_.thinking();
    const json empty = rc_.chat ? json::object() : json{{"text", ""}};
    out += sse(chunk_json(rc_, empty, finish_reason(r, shaper_.has_tool_calls()), entries(lp)));
    if (rc_.include_usage)
      out += sse({{"id", rc_.id},
                  {"object", rc_.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", rc_.created},
                  {"model", rc_.model},
                  {"choices", json::array()},
                  {"usage", usage_json(rc_, r)}});
    return out + "data: [DONE]\n\n";
  }
  std::string failure(const std::string& message) override {
    const json err = {{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}};
    return sse(err) + "data: [DONE]\n\n";
  }

 private:
  // Pending logprob entries ride on the next chunk that carries choices.
  json entries(std::vector<TokenLogprob>& lp) {
    if (!logprobs_ || lp.empty()) return nullptr;
    json c = {{"content", logprob_entries(lp, *tok_)}};
    lp.clear();
    return c;
  }
  ResponseCtx rc_;
  OutputShaper shaper_;
  const Tokenizer* tok_;
  bool logprobs_;
};

}  // namespace

Prepared Server::Impl::prepare(const ApiRequest& ar, const std::string& body, bool chat) {
  const Tokenizer& tok = *rt.tokenizer;
  Prepared p;
  if (chat) {
    ChatOptions co;
    co.kind = rt.template_kind;
    co.add_generation_prompt = true;
    const bool force_tool = ar.tool_choice == ToolChoice::Required || ar.tool_choice == ToolChoice::Named;
    if (force_tool && ar.json_schema)
      throw bad_request("a required or named tool_choice cannot be combined with a JSON response_format",
                        "response_format");
    // Structured output constrains the reply from its first token, so it runs without a thinking block.
    co.enable_thinking =
        ar.enable_thinking.value_or(true) && !(force_tool && !ar.forced_output) && !ar.json_schema;
    co.preserve_thinking = ar.preserve_thinking;
    const json tools = ar.tool_choice == ToolChoice::None ? json(nullptr) : ar.tools;
    std::string text;
    try {
      // Request text is marked literal, so a user who types "<|im_start|>" gets text, not the control token
      // (RELIABILITY.md T27); the ids are otherwise those of encode(text).
      const OrderedChat oc = ordered_chat(body, !tools.is_null());
      RenderedChat rc = render_chat_marked(oc.messages, oc.tools, co);
      text = std::move(rc.text);
      p.gen.prompt = tok.encode_marked(text, rc.literal);
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      throw bad_request(std::string("messages: ") + e.what(), "messages");
    }
    p.thinking = ends_with(text, "<think>\n");
    p.detect_think = co.enable_thinking && !p.thinking;
    OutputParserOptions po;
    po.thinking = p.thinking;
    po.tools = tools;
    p.parser = std::move(po);
    p.gen.snapshot_at = chat_snapshot_points(p.gen.prompt, tok);
    p.gen.snapshot_reply = true;
    if (force_tool && !ar.forced_output) {
      std::string prefix = "<tool_call>\n<function=";
      if (ar.tool_choice == ToolChoice::Named) prefix += ar.named_tool + ">\n";
      p.gen.forced = tok.encode(prefix);
      p.gen.forced_is_prefix = true;
    }
  } else {
    p.gen.prompt = ar.prompt_is_tokens ? ar.prompt_tokens : tok.encode(ar.prompt);
    p.gen.snapshot_at = {static_cast<int64_t>(p.gen.prompt.size())};
  }
  if (ar.forced_output) {
    p.gen.forced = tok.encode(*ar.forced_output);
    if (im_end_id >= 0) p.gen.forced.push_back(im_end_id);
    p.gen.forced_is_prefix = false;
  }
  const int64_t n_prompt = static_cast<int64_t>(p.gen.prompt.size());
  const int64_t ctx = rt.engine->max_context();
  if (n_prompt == 0) throw bad_request("the prompt is empty after tokenization", chat ? "messages" : "prompt");
  if (n_prompt >= ctx) {
    ApiError e = bad_request(
        fmt::format("This model's maximum context length is {} tokens. However, your request has {} prompt tokens "
                    "(at least one token must be left for the completion). Please shorten the {}.",
                    ctx, n_prompt, chat ? "messages" : "prompt"),
        chat ? "messages" : "prompt", "context_length_exceeded");
    e.extra = {{"n_prompt_tokens", n_prompt}, {"n_ctx", ctx}};
    throw e;
  }
  p.gen.max_tokens = ar.max_tokens;  // clamped to the room left in the context by the generator
  p.gen.sampling = ar.sampling;
  p.gen.stop = ar.stop;
  p.gen.ignore_eos = ar.ignore_eos;
  p.gen.cache_key = ar.cache_key;
  p.gen.top_logprobs = ar.top_logprobs;
  p.gen.json_schema = ar.json_schema;
  // Offered tools stay usable: the reply may be a tool call instead of the JSON value.
  p.gen.json_allows_tool_call = chat && ar.json_schema && ar.tool_choice == ToolChoice::Auto;
  return p;
}

Submitted Server::Impl::submit(const ApiRequest& ar, const std::string& body, bool chat) {
  Prepared p = prepare(ar, body, chat);
  auto job = std::make_shared<Job>();
  job->gen = std::move(p.gen);
  if (!scheduler->submit(job))
    throw ApiError(429, "rate_limit_error",
                   fmt::format("the server is busy ({} requests queued); retry later", opt.max_queue), "",
                   "queue_full");
  open_requests++;

  Submitted sub{job, {}, std::move(p)};
  ResponseCtx& rc = sub.rc;
  rc.chat = chat;
  rc.id = random_id(chat ? "chatcmpl-" : "cmpl-");
  rc.model = rt.model_id;
  rc.created = static_cast<int64_t>(std::time(nullptr));
  rc.include_usage = ar.include_usage;
  rc.thinking = sub.prep.thinking;
  rc.think_end_id = think_end_id;
  return sub;
}

std::optional<GenerateResult> Server::Impl::collect(Job& job, OutputShaper& shaper, const ConnectionWatch& watch) {
  bool finished = false;
  while (!finished) {
    shaper.push(job.take(200ms, finished));
    if (!finished && watch.closed()) {
      job.cancel = true;
      log::info("client went away; request cancelled");
      return std::nullopt;
    }
  }
  std::lock_guard lk(job.mu);
  if (job.error) throw ApiError(500, "server_error", "generation failed: " + *job.error);
  shaper.finish();
  return job.result;
}

void Server::Impl::handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  try {
    admit(req, /*json_body=*/true);
    ApiRequest ar = parse_request(req.body, chat, limits);
    if (!ar.model.empty() && ar.model != rt.model_id) throw model_not_found(ar.model);

    const Tokenizer& tok = *rt.tokenizer;
    Submitted sub = submit(ar, req.body, chat);
    ResponseCtx& rc = sub.rc;
    const Prepared& p = sub.prep;
    auto job = sub.job;
    OutputShaper shaper(p.parser, ar.parallel_tool_calls, p.detect_think);
    ConnectionWatch watch(req.remote_addr, req.remote_port, req.local_port);

    if (!ar.stream) {
      OpenRequest done{open_requests};
      const std::optional<GenerateResult> done_result = collect(*job, shaper, watch);
      if (!done_result) return;
      const GenerateResult& r = *done_result;
      rc.thinking = shaper.thinking();
      json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r, shaper.has_tool_calls())}};
      if (ar.top_logprobs >= 0) choice["logprobs"] = {{"content", logprob_entries(r.logprobs, tok)}, {"refusal", nullptr}};
      if (chat) choice["message"] = shaper.message();
      else choice["text"] = shaper.text();
      json body = {{"id", rc.id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", rc.created},
                   {"model", rc.model},
                   {"choices", json::array({choice})},
                   {"usage", usage_json(rc, r)}};
      send_json(res, 200, body);
      metrics.request_done(200);
      return;
    }

    stream_job(res, job, watch, std::make_shared<ChatEvents>(rc, std::move(shaper), &tok, ar.top_logprobs >= 0));
  } catch (...) {
    answer_exception(res);
  }
}

}  // namespace fern::server
