// `fern quantize IN OUT`: an HF bf16 checkpoint directory -> an MLX-layout affine checkpoint with the tensor
// names, dtypes and config keys mlx-lm's converter writes (MODEL.md 3b). Streams tensor by tensor (a block of
// rows at a time) with bounded memory, writes shards plus the index, and copies the tokenizer and generation
// files. Tested by tests/model/test_quant_checkpoint.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace fern {

struct QuantizeOptions {
  int bits = 4;
  int group_size = 64;
  uint64_t max_shard_bytes = uint64_t(5) << 30;  // mlx-lm's default shard size
  std::function<void(uint64_t, uint64_t)> progress;
};

void quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& opt = {});

}  // namespace fern
