#include "server/metrics.h"

#include <fmt/format.h>

namespace fern::server {

void Metrics::request_done(int status) {
  std::lock_guard lk(mu_);
  requests_by_status_[status]++;
}

void Metrics::generation_done(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens, double ttft_s,
                              double decode_s) {
  std::lock_guard lk(mu_);
  generations_++;
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
  completion_tokens_ += completion_tokens;
  ttft_sum_ += ttft_s;
  // The first token comes from prefill; the rest are decode steps.
  if (completion_tokens > 1 && decode_s > 0) {
    decode_tokens_ += completion_tokens - 1;
    decode_seconds_ += decode_s;
    last_decode_tps_ = double(completion_tokens - 1) / decode_s;
  }
}

std::string Metrics::prometheus_text() const {
  std::lock_guard lk(mu_);
  std::string o;
  o += "# HELP fern_requests_total HTTP requests answered, by status code.\n# TYPE fern_requests_total counter\n";
  for (auto [st, n] : requests_by_status_) o += fmt::format("fern_requests_total{{status=\"{}\"}} {}\n", st, n);
  o += "# HELP fern_generations_total Generations run by the engine.\n# TYPE fern_generations_total counter\n";
  o += fmt::format("fern_generations_total {}\n", generations_);
  o += "# HELP fern_prompt_tokens_total Prompt tokens of finished generations.\n"
       "# TYPE fern_prompt_tokens_total counter\n";
  o += fmt::format("fern_prompt_tokens_total {}\n", prompt_tokens_);
  o += "# HELP fern_cache_hit_tokens_total Prompt tokens restored from session snapshots instead of prefilled.\n"
       "# TYPE fern_cache_hit_tokens_total counter\n";
  o += fmt::format("fern_cache_hit_tokens_total {}\n", cached_tokens_);
  o += "# HELP fern_generation_tokens_total Generated tokens.\n# TYPE fern_generation_tokens_total counter\n";
  o += fmt::format("fern_generation_tokens_total {}\n", completion_tokens_);
  o += "# HELP fern_time_to_first_token_seconds Time from the start of a generation to its first token.\n"
       "# TYPE fern_time_to_first_token_seconds summary\n";
  o += fmt::format("fern_time_to_first_token_seconds_sum {:.6f}\nfern_time_to_first_token_seconds_count {}\n",
                   ttft_sum_, generations_);
  o += "# HELP fern_decode_tokens_per_second Decode speed over all generations.\n"
       "# TYPE fern_decode_tokens_per_second gauge\n";
  o += fmt::format("fern_decode_tokens_per_second {:.3f}\n",
                   decode_seconds_ > 0 ? double(decode_tokens_) / decode_seconds_ : 0.0);
  o += "# HELP fern_last_decode_tokens_per_second Decode speed of the last generation.\n"
       "# TYPE fern_last_decode_tokens_per_second gauge\n";
  o += fmt::format("fern_last_decode_tokens_per_second {:.3f}\n", last_decode_tps_);
  o += "# HELP fern_queue_depth Requests waiting for the engine.\n# TYPE fern_queue_depth gauge\n";
  o += fmt::format("fern_queue_depth {}\n", queue_depth_.load());
  o += "# HELP fern_requests_running Requests the engine is running (0 or 1).\n# TYPE fern_requests_running gauge\n";
  o += fmt::format("fern_requests_running {}\n", running_.load());
  return o;
}

}  // namespace fern::server
