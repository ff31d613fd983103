#include "engine/stop_matcher.h"

#include <algorithm>

namespace fern {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopMatcher::Result StopMatcher::push(const std::string& text) {
  Result r;
  if (stopped_) return r;
  held_ += text;
  if (stops_.empty()) {
    r.text.swap(held_);
    return r;
  }
  // Earliest stop occurrence wins (so the emitted text is the shortest correct prefix).
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    r.text = held_.substr(0, first);
    r.stopped = stopped_ = true;
    held_.clear();
    return r;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t maxlen = std::min(s.size() - 1, held_.size());
    for (size_t len = maxlen; len > hold; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  r.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace fern
