#include "server/server.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <random>
#include <thread>

#include "core/log.h"
#include "server/server_impl.h"

namespace fern::server {

using nlohmann::json;

std::string random_id(const std::string& prefix, size_t hex_chars) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (size_t i = 0; i < hex_chars; ++i) s += hex[rng() & 15];
  return s;
}

Server::Impl::Impl(Runtime& r, ServerOptions o) : rt(r), opt(std::move(o)) {
  const Tokenizer& tok = *rt.tokenizer;
  limits.vocab_size = rt.engine->config().vocab_size;
  limits.allow_forced_output = opt.test_forced_output;
  if (opt.cache_bytes > 0)
    cache = std::make_unique<SessionCache>(rt.engine->backend(), rt.engine->config(), opt.cache_bytes);
  GeneratorOptions go;
  go.eos_ids = rt.eos_ids;
  generator = std::make_unique<Generator>(*rt.engine, tok, cache.get(), go);
  scheduler = std::make_unique<Scheduler>(*generator, opt.max_queue, metrics);
  if (auto id = tok.token_id("</think>")) think_end_id = *id;
  if (auto id = tok.token_id("<|im_end|>")) im_end_id = *id;
}

void Server::Impl::admit(const httplib::Request& req, bool json_body) const {
  if (draining) throw ApiError(503, "unavailable_error", "the server is shutting down", "", "shutting_down");
  if (!json_body) return;
  const std::string ctype = req.get_header_value("Content-Type");
  if (!ctype.empty() && ctype.find("json") == std::string::npos)
    throw bad_request("Content-Type must be application/json");
}

ApiError Server::Impl::model_not_found(const std::string& name) const {
  return ApiError(404, "not_found_error",
                  "the model '" + name.substr(0, 200) + "' does not exist; this server serves '" + rt.model_id + "'",
                  "model", "model_not_found");
}

void Server::Impl::send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void Server::Impl::send_error(httplib::Response& res, const ApiError& e, bool anthropic) {
  if (e.status == 429 || e.status == 503) {
    int secs = std::max(1, static_cast<int>(std::ceil(scheduler->recent_job_seconds())));
    res.set_header("Retry-After", std::to_string(secs));
  }
  // The SDKs retry 5xx and 429 by default; a deterministic failure must not be retried.
  if (e.status >= 400 && e.status < 500 && e.status != 429) res.set_header("x-should-retry", "false");
  send_json(res, e.status, anthropic ? anthropic_error_json(e) : error_json(e));
}

void Server::Impl::setup_routes() {
  // One thread per connection (cpp-httplib). A waiting or streaming request holds its thread, and an idle
  // keep-alive connection holds one until the keep-alive timeout, so the pool has room for every queued request,
  // the running one, and as many again for /health, /metrics, rejections and idle connections.
  const size_t threads = 2 * opt.max_queue + 32;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  http.set_keep_alive_timeout(3);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {  // CORS preflight for browser clients (the SDKs' X-Stainless-* headers)
      res.set_header("Access-Control-Allow-Origin", "*");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "*");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opt.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    // The key as OpenAI clients send it, or as Anthropic clients do (x-api-key).
    std::string auth = req.get_header_value("Authorization");
    const std::string x_key = req.get_header_value("x-api-key");
    if (auth != "Bearer " + opt.api_key && x_key != opt.api_key) {
      send_error(res,
                 ApiError(401, "authentication_error",
                          auth.empty() && x_key.empty()
                              ? "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                              : "invalid API key",
                          "", "invalid_api_key"),
                 req.path.rfind("/v1/messages", 0) == 0);
      metrics.request_done(401);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, ApiError(404, "not_found_error", "no route for " + req.method + " " +
                                                            (req.path.size() > 200 ? req.path.substr(0, 200) : req.path)));
    } else if (res.status == 413) {
      send_error(res, ApiError(413, "invalid_request_error",
                               fmt::format("the request body is larger than {} bytes", opt.max_body_bytes), "",
                               "request_too_large"));
    } else {
      send_error(res, ApiError(res.status, res.status >= 500 ? "server_error" : "invalid_request_error",
                               fmt::format("HTTP error {}", res.status)));
    }
  });

  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log::error("unhandled exception in a handler: {}", what);
    send_error(res, ApiError(500, "server_error", "internal server error: " + what));
    metrics.request_done(500);
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) {
      send_json(res, 503, {{"status", "shutting_down"}});
      return;
    }
    send_json(res, 200, {{"status", "ok"}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus_text(), "text/plain; version=0.0.4");
  });
  auto model_obj = [this] {
    return json{{"id", rt.model_id},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "fern"},
                {"max_model_len", rt.engine->max_context()}};
  };
  http.Get("/v1/models", [this, model_obj](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_obj()})}});
    metrics.request_done(200);
  });
  http.Get(R"(/v1/models/(.+))", [this, model_obj](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != rt.model_id) {
      send_error(res, model_not_found(req.matches[1]));
      return;
    }
    send_json(res, 200, model_obj());
  });
  for (const char* path : {"/v1/chat/completions", "/chat/completions"})
    http.Post(path, [this](const httplib::Request& req, httplib::Response& res) { handle_completion(req, res, true); });
  for (const char* path : {"/v1/completions", "/completions"})
    http.Post(path, [this](const httplib::Request& req, httplib::Response& res) { handle_completion(req, res, false); });
  for (const char* path : {"/v1/responses", "/responses"})
    http.Post(path, [this](const httplib::Request& req, httplib::Response& res) { handle_responses(req, res); });
  for (const char* path : {"/tokenize", "/v1/tokenize"})
    http.Post(path, [this](const httplib::Request& req, httplib::Response& res) { handle_tokenize(req, res, false); });
  for (const char* path : {"/detokenize", "/v1/detokenize"})
    http.Post(path, [this](const httplib::Request& req, httplib::Response& res) { handle_tokenize(req, res, true); });
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    handle_messages(req, res, false);
  });
  http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    handle_messages(req, res, true);
  });
  for (const char* path : {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                           "/v1/messages"})
    http.Get(path, [this](const httplib::Request&, httplib::Response& res) {
      send_error(res, ApiError(405, "invalid_request_error", "use POST for this endpoint"));
    });
}

Server::Server(Runtime& rt, ServerOptions opt) : impl_(std::make_unique<Impl>(rt, std::move(opt))) {
  impl_->setup_routes();
}

Server::~Server() {
  if (impl_->scheduler) impl_->scheduler->stop();
}

int Server::bind() {
  auto& im = *impl_;
  if (im.opt.port == 0) {
    im.bound_port = im.http.bind_to_any_port(im.opt.host);
  } else if (im.http.bind_to_port(im.opt.host, im.opt.port)) {
    im.bound_port = im.opt.port;
  }
  if (im.bound_port <= 0) fail("cannot listen on {}:{} (in use, or not a local address?)", im.opt.host, im.opt.port);
  return im.bound_port;
}

int Server::port() const { return impl_->bound_port; }

void Server::run() {
  if (impl_->bound_port <= 0) bind();
  impl_->http.listen_after_bind();
  // shutdown() stops the listener from another thread; let it finish before the caller destroys the server.
  while (impl_->draining && !impl_->shutdown_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void Server::shutdown() {
  auto& im = *impl_;
  using Clock = std::chrono::steady_clock;
  im.draining = true;
  log::info("shutting down: refusing new requests, draining for up to {:.1f} s", im.opt.drain_seconds);
  const auto deadline = Clock::now() + std::chrono::duration<double>(im.opt.drain_seconds);
  while (im.open_requests > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (im.open_requests > 0) {
    log::info("drain time over: ending {} open request(s)", im.open_requests.load());
    im.scheduler->cancel_all();
    const auto hard = Clock::now() + std::chrono::seconds(5);
    while (im.open_requests > 0 && Clock::now() < hard) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  im.scheduler->stop();
  im.http.stop();
  im.shutdown_done = true;
}

}  // namespace fern::server
