// Reads and validates a Hugging Face tokenizer.json for byte-level BPE (MODEL.md 4). The file is untrusted input
// (RELIABILITY.md 3 C): every count, id and string is checked, and anything unsupported or inconsistent is a
// fern::Error that names the file and the key.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fern {

struct AddedTokenSpec {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct SplitSpec {
  std::string pattern;
  bool literal = false;  // {"String": ...} patterns match literally
};

struct TokenizerSpec {
  std::string source;                                       // file name for error messages
  std::vector<std::pair<std::string, int32_t>> vocab;       // byte-level token text -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool ignore_merges = false;
  std::vector<AddedTokenSpec> added;
  bool nfc = false;
  std::vector<SplitSpec> splits;  // applied one after the other ("Isolated" behaviour)
};

// Limits that keep a hostile file from exhausting memory before validation finishes.
inline constexpr size_t kMaxTokenizerFileBytes = size_t(256) << 20;
inline constexpr int32_t kMaxTokenId = 1 << 24;
inline constexpr size_t kMaxMerges = size_t(4) << 20;
inline constexpr int kMaxJsonDepth = 64;

TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& source);

}  // namespace fern
