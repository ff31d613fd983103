// A tensor (or a quantized triplet .weight/.scales/.biases) produced row by row, so that a whole checkpoint can
// be written to disk, built in memory or uploaded to a device without ever holding more than a few rows of
// floats. Used by the synthetic generator (model/synth.h), the quantizer (quant/) and the safetensors writer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fern {

struct StreamPart {
  std::string name;            // checkpoint tensor name
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  int64_t numel() const;
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }
};

struct StreamTensor {
  std::vector<StreamPart> parts;  // 1 part, or 3 for a quantized weight (U32 .weight, .scales, .biases)
  int64_t rows = 0;               // every part splits into `rows` equal rows of nbytes()/rows bytes
  int bits = 16;                  // 4 or 8 for a quantized triplet
  int group_size = 0;
  // Writes rows [row0, row0+n) of every part: dst[i] points at row `row0` of part i. Safe to call from several
  // threads at once on disjoint rows.
  std::function<void(int64_t row0, int64_t n, uint8_t* const* dst)> fill;

  uint64_t row_bytes(size_t part) const { return parts[part].nbytes() / static_cast<uint64_t>(rows); }
  uint64_t nbytes() const {
    uint64_t n = 0;
    for (const auto& p : parts) n += p.nbytes();
    return n;
  }
  // Fills rows [row0, row0+n) in parallel blocks (OpenMP); dst as for fill().
  void fill_parallel(int64_t row0, int64_t n, uint8_t* const* dst) const;
};

}  // namespace fern
