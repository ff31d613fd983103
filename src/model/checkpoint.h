// The safetensors files of one model directory: `model.safetensors.index.json` (sharded) or a single
// `model.safetensors` (or every *.safetensors when neither exists). Shard names from the index must be plain
// file names that resolve (after symlinks) inside the model directory; missing shards and tensors listed in the
// index but absent from their shard are errors naming them; shard tensors the index does not list are ignored
// with a warning. Also the in-memory tensor source used by synth_weights(). Tested by test_checkpoint.cpp.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"

namespace fern {

// A tensor found in a checkpoint: its header entry, its bytes and the file it lives in (for messages).
struct TensorRef {
  const SafetensorsEntry* entry = nullptr;
  const uint8_t* data = nullptr;
  std::string file;
};

// Name -> tensor lookup that the loader binds from (files on disk, or buffers in memory).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const TensorRef* find(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;
  // Something that keeps the bytes alive for as long as tensors point into them.
  virtual std::shared_ptr<void> keep_alive() const = 0;
  // Where the tensors come from, for messages.
  virtual std::string describe() const = 0;
};

class CheckpointFiles : public TensorSource {
 public:
  static std::shared_ptr<CheckpointFiles> open(const std::string& model_dir);
  const TensorRef* find(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::shared_ptr<void> keep_alive() const override;
  std::string describe() const override { return dir_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef> tensors_;
};

// Owned tensors in memory, laid out like a safetensors data section.
class MemoryTensors : public TensorSource {
 public:
  explicit MemoryTensors(std::string what) : what_(std::move(what)) {}
  // Allocates a tensor (64-byte aligned) and returns its bytes for the caller to fill.
  uint8_t* add(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  const TensorRef* find(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::shared_ptr<void> keep_alive() const override;
  std::string describe() const override { return what_; }

 private:
  struct Item {
    SafetensorsEntry entry;
    std::shared_ptr<HostBuffer> buf;
    TensorRef ref;
  };
  std::string what_;
  std::map<std::string, std::unique_ptr<Item>> items_;
};

// Checks that `shard` from the index of `model_dir` is a plain file name resolving inside the directory, and
// returns its full path. `index_path` names the index in errors.
std::string resolve_shard_path(const std::string& model_dir, const std::string& shard, const std::string& index_path,
                               const std::string& tensor);

}  // namespace fern
