// One worker thread owns the engine and runs one generation at a time, taking jobs from a bounded FIFO queue.
// HTTP handler threads submit jobs and read their output through the job (text pieces and a final result), and
// cancel them by setting a flag that the generator polls before every step.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/generator.h"
#include "server/metrics.h"

namespace fern::server {

struct Job {
  GenerateRequest gen;
  std::atomic<bool> cancel{false};

  // Written by the worker, read by the handler (under mu).
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;        // output text not yet taken by the handler
  std::vector<TokenLogprob> pending_logprobs;  // with gen.top_logprobs >= 0: entries not yet taken
  bool started = false;
  bool done = false;
  GenerateResult result;
  std::optional<std::string> error;  // the generation failed (e.g. NaN logits); message for the client

  // Moves the pending text out (and the pending logprob entries into *logprobs, when given); waits up to `timeout`
  // for text or the end.
  std::string take(std::chrono::milliseconds timeout, bool& finished, std::vector<TokenLogprob>* logprobs = nullptr);
};

class Scheduler {
 public:
  Scheduler(Generator& gen, size_t max_queue, Metrics& metrics);
  ~Scheduler();

  // False when the queue is full (the caller answers 429).
  bool submit(const std::shared_ptr<Job>& job);
  // Cancels every queued and running job.
  void cancel_all();
  // Stops the worker after the current job (queued jobs are cancelled).
  void stop();
  size_t queue_depth() const;
  bool idle() const;
  // Typical seconds a job takes (for Retry-After).
  double recent_job_seconds() const;

 private:
  void run();
  Generator& gen_;
  size_t max_queue_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;
  bool stopping_ = false;
  double avg_job_s_ = 1.0;
  std::thread worker_;
};

}  // namespace fern::server
