// The OpenAI-compatible HTTP server (cpp-httplib): routes, API-key check, body limit, error envelope, the queue in
// front of the one engine worker, graceful shutdown. Wire format: docs/SERVER.md (after API.md section 14).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/runtime.h"

namespace fern::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                     // 0 = any free port (see Server::port())
  std::string api_key;                 // empty = no authentication
  size_t max_queue = 16;               // requests waiting for the engine; more get 429
  size_t cache_bytes = size_t(4) << 30;  // session snapshot budget; 0 disables the session cache
  size_t max_body_bytes = size_t(16) << 20;
  double drain_seconds = 30;           // on SIGTERM: time open requests get to finish
  bool test_forced_output = false;     // accept the test-only "test_forced_output" request field
};

class Server {
 public:
  Server(Runtime& rt, ServerOptions opt);
  ~Server();
  // Binds the listening socket; returns the port (useful with port 0).
  int bind();
  // Serves until shutdown() has finished. Returns when the listening loop ends.
  void run();
  // Graceful stop (from another thread): refuse new work (503), let open requests finish for drain_seconds, end
  // the rest (streams get a last chunk and [DONE]), then stop listening.
  void shutdown();
  int port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fern::server
