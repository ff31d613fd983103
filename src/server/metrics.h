// Server counters and gauges, exported as Prometheus text on GET /metrics.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace fern::server {

class Metrics {
 public:
  void request_done(int status);
  void generation_done(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens, double ttft_s,
                       double decode_s);
  void set_queue_depth(int64_t n) { queue_depth_ = n; }
  void set_running(int64_t n) { running_ = n; }
  std::string prometheus_text() const;

 private:
  mutable std::mutex mu_;
  std::map<int, int64_t> requests_by_status_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, generations_ = 0;
  double ttft_sum_ = 0, decode_seconds_ = 0;
  int64_t decode_tokens_ = 0;
  double last_decode_tps_ = 0;
  std::atomic<int64_t> queue_depth_{0}, running_{0};
};

}  // namespace fern::server
