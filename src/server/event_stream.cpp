// The one driver of the server-sent event streams of all three APIs: take the job's output as it comes, hand it to
// the API's EventSource, write what it makes; keep-alives while nothing comes; cancel the job when the client goes
// away or a write fails.
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "server/server_impl.h"

namespace fern::server {

using namespace std::chrono_literals;

void Server::Impl::stream_job(httplib::Response& res, std::shared_ptr<Job> job, const ConnectionWatch& watch,
                              std::shared_ptr<EventSource> src) {
  struct State {
    std::shared_ptr<Job> job;
    ConnectionWatch watch;
    std::shared_ptr<EventSource> src;
    std::vector<TokenLogprob> logprobs;  // taken with the text, not yet sent
    bool started = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<State>(State{std::move(job), watch, std::move(src), {}, false, {}});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) {
          if (s.empty()) return true;
          st->last_write = std::chrono::steady_clock::now();
          return sink.write(s.data(), s.size());
        };
        auto fail_client = [&] {
          st->job->cancel = true;
          return false;
        };
        if (!st->started) {
          st->started = true;
          if (!write(st->src->start())) return fail_client();
        }
        bool finished = false;
        const std::string text = st->job->take(100ms, finished, st->src->wants_logprobs() ? &st->logprobs : nullptr);
        if (!write(st->src->output(text, st->logprobs))) return fail_client();
        if (finished) {
          std::unique_lock lk(st->job->mu);
          if (st->job->error) {
            write(st->src->failure("generation failed: " + *st->job->error));
          } else {
            const GenerateResult r = st->job->result;
            lk.unlock();
            if (!write(st->src->finish(r, st->logprobs))) return fail_client();
          }
          sink.done();
          return true;
        }
        if (st->watch.closed()) return fail_client();
        // A comment or ping keeps proxies and clients from timing out during a long queue wait or prefill.
        if (std::chrono::steady_clock::now() - st->last_write > 5s && !write(st->src->keep_alive()))
          return fail_client();
        return true;
      },
      [this, st](bool success) {
        if (!success) st->job->cancel = true;  // the client went away or the write failed
        metrics.request_done(200);
        open_requests--;
      });
}

void Server::Impl::answer_exception(httplib::Response& res, bool anthropic) {
  try {
    throw;
  } catch (const ApiError& e) {
    send_error(res, e, anthropic);
    metrics.request_done(e.status);
  } catch (const InternalError& e) {
    log::error("internal error in a request: {}", e.what());
    send_error(res, ApiError(500, "server_error", std::string("internal error: ") + e.what()), anthropic);
    metrics.request_done(500);
  } catch (const Error& e) {
    send_error(res, bad_request(e.what()), anthropic);
    metrics.request_done(400);
  } catch (const std::exception& e) {
    log::error("unexpected exception in a request: {}", e.what());
    send_error(res, ApiError(500, "server_error", std::string("internal error: ") + e.what()), anthropic);
    metrics.request_done(500);
  }
}

}  // namespace fern::server
