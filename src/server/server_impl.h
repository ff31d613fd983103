// Internal state of the server shared by its source files (server.cpp: setup, routes, lifecycle;
// completions.cpp: the OpenAI chat / completions endpoints and the request preparation all APIs share;
// responses.cpp: the Responses API; messages.cpp: the Anthropic Messages API; tokenize.cpp; event_stream.cpp: the
// SSE driver and the error answers).
#pragma once
#include <httplib.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "engine/generator.h"
#include "engine/session_cache.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/connection_watch.h"
#include "server/output_shaper.h"
#include "server/scheduler.h"
#include "server/server.h"
#include "tokenizer/output_parser.h"

namespace fern::server {

// A chat or completions request turned into a generation request (chat template rendered, tokenized, checked
// against the context).
struct Prepared {
  GenerateRequest gen;
  std::optional<OutputParserOptions> parser;  // chat only
  bool thinking = false;
  bool detect_think = false;  // thinking is on but the template leaves "<think>" to the model (Qwen3)
};

// Everything a response needs besides the output.
struct ResponseCtx {
  bool chat = true;
  std::string id, model;
  int64_t created = 0;
  bool include_usage = false;
  bool thinking = false;
  int32_t think_end_id = -1;
};

// A request queued for the engine, with what its response needs (the OpenAI and the Anthropic endpoints answer it
// each in their own format).
struct Submitted {
  std::shared_ptr<Job> job;
  ResponseCtx rc;
  Prepared prep;  // its `gen` moved into the job
};

// Stored Responses API conversations (previous_response_id), as chat messages: the most recent kCapacity, and
// fewer when they hold more than kMaxBytes of JSON (request bodies may be large; the store must not grow with them).
class ResponseStore {
 public:
  static constexpr size_t kCapacity = 256;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  void put(const std::string& id, nlohmann::ordered_json messages);
  std::optional<nlohmann::ordered_json> get(const std::string& id) const;

 private:
  struct Entry {
    nlohmann::ordered_json messages;
    size_t bytes = 0;
  };
  mutable std::mutex mu_;
  std::deque<std::string> order_;
  std::unordered_map<std::string, Entry> by_id_;
  size_t bytes_ = 0;
};

// One API's view of a queued job's output as server-sent events (OpenAI chat/completions, Responses, Anthropic
// Messages); Server::Impl::stream_job drives it.
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual std::string start() = 0;  // the events before any output
  // The events for newly generated text. `logprobs` holds the entries taken so far (when wants_logprobs()); the
  // source removes those it sends.
  virtual std::string output(const std::string& text, std::vector<TokenLogprob>& logprobs) = 0;
  virtual std::string finish(const GenerateResult& r, std::vector<TokenLogprob>& logprobs) = 0;  // the last events
  virtual std::string failure(const std::string& message) = 0;  // an error after the stream started
  virtual std::string keep_alive() { return ": keep-alive\n\n"; }
  virtual bool wants_logprobs() const { return false; }
};

struct Server::Impl {
  Impl(Runtime& rt, ServerOptions opt);

  Runtime& rt;
  ServerOptions opt;
  RequestLimits limits;
  Metrics metrics;
  std::unique_ptr<SessionCache> cache;
  std::unique_ptr<Generator> generator;
  std::unique_ptr<Scheduler> scheduler;
  httplib::Server http;
  int bound_port = -1;
  int32_t think_end_id = -1;   // "</think>", for reasoning_tokens
  int32_t im_end_id = -1;
  std::atomic<bool> draining{false};
  std::atomic<bool> shutdown_done{false};
  std::atomic<int> open_requests{0};  // inference requests whose response is not finished
  std::unique_ptr<ResponseStore> responses = std::make_unique<ResponseStore>();  // for previous_response_id

  void setup_routes();
  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  // Renders and tokenizes a parsed request (`body`: the JSON it was parsed from, for the tools' key order). Throws
  // ApiError (400, e.g. for a prompt the context cannot hold).
  Prepared prepare(const ApiRequest& ar, const std::string& body, bool chat);
  // prepare(), then queues the request and counts it in open_requests. Throws ApiError (also 429).
  Submitted submit(const ApiRequest& ar, const std::string& body, bool chat);
  // Answers with an SSE stream of `src`'s events for the queued job (event_stream.cpp); the request is counted done
  // and out of open_requests when the stream ends.
  void stream_job(httplib::Response& res, std::shared_ptr<Job> job, const ConnectionWatch& watch,
                  std::shared_ptr<EventSource> src);
  // Inside a catch (...) of a handler: the error answer for the exception in flight (400 for bad input, 500 for
  // internal errors), counted in the metrics.
  void answer_exception(httplib::Response& res, bool anthropic = false);
  // A non-streamed answer: feeds the job's output to the shaper until the job ends, then finishes the shaper and
  // returns the result. Nothing when the client went away first (the job is then cancelled and nothing is to be
  // sent); throws ApiError 500 when the generation failed.
  std::optional<GenerateResult> collect(Job& job, OutputShaper& shaper, const ConnectionWatch& watch);
  // POST /v1/responses (the OpenAI Responses API, responses.cpp).
  void handle_responses(const httplib::Request& req, httplib::Response& res);
  // POST /tokenize and /detokenize (tokenize.cpp).
  void handle_tokenize(const httplib::Request& req, httplib::Response& res, bool detokenize);
  // POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API, messages.cpp).
  void handle_messages(const httplib::Request& req, httplib::Response& res, bool count_only);
  // anthropic: the Messages API's envelope instead of OpenAI's.
  void send_error(httplib::Response& res, const ApiError& e, bool anthropic = false);
  ApiError model_not_found(const std::string& name) const;  // 404 naming the served model
  // Throws the ApiError that refuses a generation request: 503 while draining; with json_body, 400 for a
  // Content-Type that is given and not JSON.
  void admit(const httplib::Request& req, bool json_body) const;
  void send_json(httplib::Response& res, int status, const nlohmann::json& body);
};

// Counts a request out of open_requests when its handler returns (the non-streamed answers).
struct OpenRequest {
  std::atomic<int>& n;
  ~OpenRequest() { n--; }
};

// Random suffix for response and tool-call ids.
std::string random_id(const std::string& prefix, size_t hex_chars = 24);

}  // namespace fern::server
