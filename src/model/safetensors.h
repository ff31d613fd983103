// safetensors reading: a header parser that validates exactly what the reference library validates
// (RELIABILITY.md 1.2: size cap, UTF-8 JSON object, string metadata, known dtypes, checked shape x dtype ==
// byte span, entries sorted by offset with no gap or overlap and covering the whole data section) plus
// duplicate names, and a read-only mmap of a validated file. A model directory (single file or sharded with
// model.safetensors.index.json, shard names confined to the directory) is in model/checkpoint.h.
// Tested by tests/model/test_safetensors.cpp (label parser).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fern {

constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;  // the reference library's cap
constexpr int kSafetensorsMaxRank = 8;

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;        // as written ("BF16", "F8_E4M3", ...)
  std::optional<DType> dtype;    // empty for a valid safetensors dtype this engine has no type for
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // byte offsets relative to the data section
  int64_t numel() const;
};

struct SafetensorsHeader {
  uint64_t header_size = 0;                   // N, the JSON length
  std::vector<SafetensorsEntry> entries;      // sorted by offset
  std::map<std::string, std::string> metadata;
  uint64_t data_offset() const { return 8 + header_size; }
  const SafetensorsEntry* find(const std::string& name) const;
  std::map<std::string, size_t> by_name;      // name -> index into entries
};

// Validates the first 8 bytes plus the header against a file of `file_size` bytes. `bytes` must hold at least
// min(file_size, 8 + N) bytes (the caller reads them). `source` names the file in errors.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t nbytes, uint64_t file_size,
                                           const std::string& source);

// A validated safetensors file mapped read-only.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* find(const std::string& name) const { return header_.find(name); }
  // Start of a tensor's bytes inside the mapping.
  const uint8_t* data(const SafetensorsEntry& e) const { return base_ + header_.data_offset() + e.begin; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

// Size in bits of one element of a safetensors dtype, or 0 for an unknown name.
int safetensors_dtype_bits(const std::string& name);
// The safetensors spelling of an engine dtype.
const char* safetensors_dtype_name(DType t);

}  // namespace fern
