// `fern serve`: the OpenAI-compatible HTTP server (docs/SERVER.md).
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/runtime.h"
#include "server/server.h"

namespace fern::cli {
namespace {

// "4G", "512M", "100k", "123" -> bytes.
size_t parse_size(const std::string& s, const char* opt) {
  if (s.empty()) fail("{}: empty size", opt);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suf(end);
  double mul = 1;
  if (suf == "" || suf == "B") mul = 1;
  else if (suf == "k" || suf == "K" || suf == "KB") mul = 1024.0;
  else if (suf == "M" || suf == "MB") mul = 1024.0 * 1024;
  else if (suf == "G" || suf == "GB") mul = 1024.0 * 1024 * 1024;
  else fail("{} '{}': use a number of bytes with an optional k, M or G suffix", opt, s);
  if (!(v >= 0) || v * mul > 1e18) fail("{} '{}' is out of range", opt, s);
  return static_cast<size_t>(v * mul);
}

std::atomic<server::Server*> g_server{nullptr};

}  // namespace

static Command reg("serve", "Serve the OpenAI-compatible HTTP API", [](CLI::App& app) {
  auto ro = std::make_shared<RuntimeOptions>();
  auto so = std::make_shared<server::ServerOptions>();
  auto cache = std::make_shared<std::string>("4G");
  auto body = std::make_shared<std::string>("16M");
  app.add_option("--model,-m", ro->model_dir, "Model directory (no --model: the built-in demo model)");
  app.add_option("--tokenizer", ro->tokenizer_path, "tokenizer.json to use instead of the model's");
  app.add_option("--backend", ro->backend, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--ctx", ro->ctx, "Context length in tokens (default: min(model maximum, 32768); demo 4096)");
  app.add_option("--threads", ro->threads, "CPU backend threads (0 = all cores)");
  app.add_option("--prefill-chunk", ro->prefill_chunk, "Prompt tokens per forward call (0 = the backend's choice)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--host", so->host, "Address to listen on")->capture_default_str();
  app.add_option("--port", so->port, "Port (0 = any free port)")->capture_default_str();
  app.add_option("--api-key", so->api_key, "Require 'Authorization: Bearer KEY' (default: $FERN_API_KEY, or none)");
  app.add_option("--max-queue", so->max_queue, "Requests that may wait for the engine; more get 429")
      ->capture_default_str();
  app.add_option("--cache-bytes", *cache, "Memory for session snapshots (0 disables the session cache)")
      ->capture_default_str();
  app.add_option("--max-body-bytes", *body, "Largest request body; larger ones get 413")->capture_default_str();
  app.add_option("--drain-seconds", so->drain_seconds, "On SIGTERM, time open requests get to finish")
      ->capture_default_str();
  app.add_flag("--test-forced-output", so->test_forced_output,
               "TESTS ONLY: accept a 'test_forced_output' request field that replaces the model's output");
  return [ro, so, cache, body]() -> int {
    so->cache_bytes = parse_size(*cache, "--cache-bytes");
    so->max_body_bytes = parse_size(*body, "--max-body-bytes");
    if (so->max_queue < 1) fail("--max-queue must be at least 1");
    if (so->api_key.empty())
      if (const char* k = std::getenv("FERN_API_KEY")) so->api_key = k;
    // SIGTERM/SIGINT go to one thread that drives the graceful shutdown (a second signal exits at once); every
    // other thread, started after this, inherits the blocked mask.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a write to a closed client socket must fail, not kill the process
    std::thread([set] {
      int sig = 0;
      sigwait(&set, &sig);
      server::Server* s = g_server.load();
      if (!s) std::_Exit(128 + sig);  // still loading: nothing to drain
      std::thread([s] { s->shutdown(); }).detach();
      sigwait(&set, &sig);
      std::fprintf(stderr, "second signal: exiting now\n");
      std::_Exit(1);
    }).detach();

    Runtime rt = load_runtime(*ro);
    if (so->test_forced_output) log::warn("--test-forced-output is on: requests may replace the model's output");
    server::Server srv(rt, *so);
    int port = srv.bind();
    if (so->host != "127.0.0.1" && so->host != "localhost" && so->host != "::1" && so->api_key.empty())
      log::warn("listening on {} without --api-key: anyone who can reach this address can use the model", so->host);
    std::printf("fern: serving %s on http://%s:%d/v1 (backend %s)\n", rt.model_id.c_str(), so->host.c_str(), port,
                rt.backend_name.c_str());
    std::fflush(stdout);
    g_server = &srv;
    srv.run();
    g_server = nullptr;
    log::info("server stopped");
    return 0;
  };
});

}  // namespace fern::cli
