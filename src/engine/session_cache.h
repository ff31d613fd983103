// Snapshots of whole sequence states for multi-turn reuse. The Gated DeltaNet recurrence cannot be rolled back, so
// a new request can only continue from a state taken exactly at a prefix of its tokens: the generator stores
// snapshots at message boundaries (the end of the last message before the generation prompt, and the end of a
// generated reply) and a later request that starts with the same tokens restores the longest one and prefills
// only the rest. Memory is bounded by a byte budget (Backend::state_bytes), least recently used evicted first.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace fern {

class SessionCache {
 public:
  SessionCache(Backend& be, const ModelConfig& cfg, size_t budget_bytes);

  // Restores into `dst` the longest snapshot whose tokens are a proper prefix of `tokens` (at least one token is
  // left to prefill, which gives the logits of the last prompt token). With a non-empty `key` only that
  // session's snapshots are considered. Returns the restored length, 0 when nothing matched (dst untouched).
  int64_t restore(std::span<const int32_t> tokens, const std::string& key, SequenceState& dst);
  // Stores a copy of `src` (which holds exactly `tokens`), evicting old snapshots to stay within the budget.
  // A snapshot larger than the whole budget is not stored.
  void insert(std::span<const int32_t> tokens, const std::string& key, const SequenceState& src);
  // Longest snapshot prefix without restoring (for tests and diagnostics).
  int64_t peek(std::span<const int32_t> tokens, const std::string& key) const;

  size_t budget_bytes() const { return budget_; }
  size_t used_bytes() const;
  size_t size() const;
  void clear();

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::string key;
    std::unique_ptr<SequenceState> state;
    size_t bytes = 0;
  };
  using List = std::list<Entry>;  // front = most recently used
  List::iterator find_locked(std::span<const int32_t> tokens, const std::string& key);
  List::const_iterator find_locked(std::span<const int32_t> tokens, const std::string& key) const;

  Backend& be_;
  ModelConfig cfg_;
  size_t budget_;
  size_t used_ = 0;
  List entries_;
  mutable std::mutex mu_;
};

}  // namespace fern
