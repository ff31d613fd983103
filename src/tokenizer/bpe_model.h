// The BPE model proper: token ids <-> raw bytes, merge ranks, and merging one pre-tokenized piece into ids.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace fern {

class BpeModel {
 public:
  // Validates the vocabulary and merges of `spec` (fern::Error naming spec.source on any inconsistency).
  explicit BpeModel(const TokenizerSpec& spec);

  // Appends the ids of one piece of raw bytes (already normalised and split).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  int32_t max_id() const { return max_id_; }
  // Raw bytes of a vocabulary id ("" for ids that are not in the vocabulary).
  const std::string& bytes_of(int32_t id) const;
  // Id of the token whose byte-level text (as written in tokenizer.json, e.g. "Ġthe") is `text`.
  int32_t id_of_text(std::string_view text) const;

 private:
  struct MergeInfo {
    int32_t rank, id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  // Open addressing over (left id, right id) keys: merge lookups are the inner loop of encoding.
  const MergeInfo* find_merge(int32_t a, int32_t b) const {
    const uint64_t key = pair_key(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const uint64_t k = keys_[i];
      if (k == key) return &vals_[i];
      if (k == kEmpty) return nullptr;
    }
  }
  size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
  void put_merge(uint64_t key, MergeInfo v);
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_large(std::vector<int32_t>& syms) const;

  std::string source_;
  bool ignore_merges_ = false;
  int32_t max_id_ = -1;
  std::vector<std::string> id_bytes_;
  std::unordered_map<std::string, int32_t> bytes_id_;
  std::array<int32_t, 256> byte_id_{};
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // no (id, id) pair has this key: ids are < 2^24
  std::vector<uint64_t> keys_;
  std::vector<MergeInfo> vals_;
  size_t mask_ = 0;
  int shift_ = 0;

  // Cache of merged pieces (most text repeats its words). Sharded so that concurrent encodes rarely contend.
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxCachedPerShard = 8192;
  static constexpr size_t kMaxCachedPieceBytes = 64;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  mutable std::array<Shard, kShards> cache_;
};

}  // namespace fern
