#include "engine/session_cache.h"

#include <algorithm>

#include "core/log.h"

namespace fern {

namespace {

bool is_prefix(const std::vector<int32_t>& pre, std::span<const int32_t> tokens) {
  return pre.size() < tokens.size() && std::equal(pre.begin(), pre.end(), tokens.begin());
}

}  // namespace

SessionCache::SessionCache(Backend& be, const ModelConfig& cfg, size_t budget_bytes)
    : be_(be), cfg_(cfg), budget_(budget_bytes) {}

SessionCache::List::iterator SessionCache::find_locked(std::span<const int32_t> tokens, const std::string& key) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (!key.empty() && it->key != key) continue;
    if (!is_prefix(it->tokens, tokens)) continue;
    if (best == entries_.end() || it->tokens.size() > best->tokens.size()) best = it;
  }
  return best;
}

SessionCache::List::const_iterator SessionCache::find_locked(std::span<const int32_t> tokens,
                                                             const std::string& key) const {
  return const_cast<SessionCache*>(this)->find_locked(tokens, key);
}

int64_t SessionCache::restore(std::span<const int32_t> tokens, const std::string& key, SequenceState& dst) {
  std::lock_guard lk(mu_);
  auto it = find_locked(tokens, key);
  if (it == entries_.end()) return 0;
  be_.copy_state(dst, *it->state);
  entries_.splice(entries_.begin(), entries_, it);  // now most recently used
  return static_cast<int64_t>(entries_.front().tokens.size());
}

int64_t SessionCache::peek(std::span<const int32_t> tokens, const std::string& key) const {
  std::lock_guard lk(mu_);
  auto it = find_locked(tokens, key);
  return it == entries_.end() ? 0 : static_cast<int64_t>(it->tokens.size());
}

void SessionCache::insert(std::span<const int32_t> tokens, const std::string& key, const SequenceState& src) {
  FERN_CHECK(src.pos == static_cast<int64_t>(tokens.size()), "snapshot of {} tokens from a state at {}",
             tokens.size(), src.pos);
  if (tokens.empty()) return;
  const size_t bytes = be_.state_bytes(cfg_, src.pos);
  std::lock_guard lk(mu_);
  if (bytes > budget_) return;
  // The same tokens again (a repeated request): refresh the existing snapshot instead of storing a copy.
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key == key && it->tokens.size() == tokens.size() &&
        std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin())) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  }
  while (used_ + bytes > budget_ && !entries_.empty()) {
    used_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  Entry e;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.key = key;
  e.state = be_.new_state(cfg_, src.pos);
  be_.copy_state(*e.state, src);
  e.bytes = bytes;
  used_ += bytes;
  entries_.push_front(std::move(e));
  log::debug("session cache: stored {} tokens ({} bytes), {} snapshots, {} of {} bytes used", tokens.size(), bytes,
             entries_.size(), used_, budget_);
}

size_t SessionCache::used_bytes() const {
  std::lock_guard lk(mu_);
  return used_;
}

size_t SessionCache::size() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

void SessionCache::clear() {
  std::lock_guard lk(mu_);
  entries_.clear();
  used_ = 0;
}

}  // namespace fern
