#include "server/scheduler.h"

#include "core/error.h"
#include "core/log.h"

namespace fern::server {

std::string Job::take(std::chrono::milliseconds timeout, bool& finished, std::vector<TokenLogprob>* logprobs) {
  std::unique_lock lk(mu);
  if (pending.empty() && !done) cv.wait_for(lk, timeout, [&] { return !pending.empty() || done; });
  std::string out;
  out.swap(pending);
  if (logprobs) {
    logprobs->insert(logprobs->end(), pending_logprobs.begin(), pending_logprobs.end());
    pending_logprobs.clear();
  }
  finished = done;
  return out;
}

Scheduler::Scheduler(Generator& gen, size_t max_queue, Metrics& metrics)
    : gen_(gen), max_queue_(max_queue), metrics_(metrics) {
  worker_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard lk(mu_);
  if (stopping_ || queue_.size() >= max_queue_) return false;
  queue_.push_back(job);
  metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
  cv_.notify_one();
  return true;
}

void Scheduler::cancel_all() {
  std::lock_guard lk(mu_);
  for (auto& j : queue_) j->cancel = true;
  if (running_) running_->cancel = true;
}

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    for (auto& j : queue_) j->cancel = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

size_t Scheduler::queue_depth() const {
  std::lock_guard lk(mu_);
  return queue_.size();
}

bool Scheduler::idle() const {
  std::lock_guard lk(mu_);
  return queue_.empty() && !running_;
}

double Scheduler::recent_job_seconds() const {
  std::lock_guard lk(mu_);
  return avg_job_s_;
}

void Scheduler::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = queue_.front();
      queue_.pop_front();
      running_ = job;
      metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
    }
    metrics_.set_running(1);
    const auto t0 = std::chrono::steady_clock::now();
    GenerateResult res;
    std::optional<std::string> err;
    if (job->cancel) {
      res.finish = FinishReason::Cancelled;
    } else {
      {
        std::lock_guard lk(job->mu);
        job->started = true;
      }
      try {
        res = gen_.generate(
            job->gen,
            [&](const std::string& text) {
              std::lock_guard lk(job->mu);
              job->pending += text;
              job->cv.notify_all();
            },
            [&] { return job->cancel.load(); },
            [&](const TokenLogprob& e) {
              std::lock_guard lk(job->mu);
              job->pending_logprobs.push_back(e);
            });
        if (res.finish != FinishReason::Cancelled)
          metrics_.generation_done(res.prompt_tokens, res.cached_tokens, res.completion_tokens, res.ttft_seconds,
                                   res.decode_seconds);
      } catch (const InternalError& e) {
        log::error("generation failed (internal error): {}", e.what());
        err = std::string("internal error: ") + e.what();
      } catch (const std::exception& e) {
        log::error("generation failed: {}", e.what());
        err = e.what();
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The scheduler lets go of the job before the job reports done, so a handler that sees it done also sees
    // the engine free.
    {
      std::lock_guard lk(mu_);
      running_.reset();
      avg_job_s_ = 0.8 * avg_job_s_ + 0.2 * secs;
    }
    metrics_.set_running(0);
    std::lock_guard lk(job->mu);
    job->result = std::move(res);
    job->error = std::move(err);
    job->done = true;
    job->cv.notify_all();
  }
}

}  // namespace fern::server
