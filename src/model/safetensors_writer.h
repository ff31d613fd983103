// Writes StreamTensors into safetensors shards (model-0000i-of-0000n.safetensors + model.safetensors.index.json,
// or a single model.safetensors), a block of rows at a time, so memory stays bounded by the block size whatever
// the model size. Each file is written under a temporary name and renamed when complete (never truncating a
// file someone may have mapped). Tested through tests/model/test_safetensors*.cpp and the loader tests.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/stream_tensor.h"

namespace fern {

struct ShardWriteOptions {
  uint64_t max_shard_bytes = uint64_t(4) << 30;  // a new shard starts before a tensor that would pass this
  std::map<std::string, std::string> metadata{{"format", "mlx"}};
  // Called with (bytes written, total bytes) after every block.
  std::function<void(uint64_t, uint64_t)> progress;
  uint64_t block_bytes = uint64_t(32) << 20;       // output bytes produced per parallel fill
};

// Returns the file names written (relative to dir).
std::vector<std::string> write_safetensors(const std::string& dir, const std::vector<StreamTensor>& tensors,
                                           const ShardWriteOptions& opt = {});

}  // namespace fern
