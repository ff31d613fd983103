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
  const MergeInfo* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_large(std::vector<int32_t>& syms) const;

  std::string source_;
  bool ignore_merges_ = false;
  int32_t max_id_ = -1;
  std::vector<std::string> id_bytes_;
  std::unordered_map<std::string, int32_t> bytes_id_;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, MergeInfo> merges_;

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
