// Internal state of the server shared by its source files (server.cpp: setup, routes, lifecycle;
// completions.cpp: the two inference endpoints).
#pragma once
#include <httplib.h>

#include <atomic>
#include <memory>
#include <string>

#include "engine/generator.h"
#include "engine/session_cache.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/scheduler.h"
#include "server/server.h"

namespace fern::server {

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

  void setup_routes();
  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void send_error(httplib::Response& res, const ApiError& e);
  void send_json(httplib::Response& res, int status, const nlohmann::json& body);
};

// Random suffix for response and tool-call ids.
std::string random_id(const std::string& prefix, size_t hex_chars = 24);

}  // namespace fern::server
