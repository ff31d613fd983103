// Tensor: a typed, contiguous, row-major view of memory that a backend owns (host or device). It never owns
// memory itself; owners are HostBuffer (below), the mmap of a checkpoint, or a backend allocation.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace fern {

enum class DType : uint8_t { F32, F16, BF16, U32, I32, U8, I64, F64, BOOL, I8, U16, I16, U64 };
enum class Device : uint8_t { Host, Cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::Host;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::Host);
  Tensor(void* d, DType t, const std::vector<int64_t>& dims, Device dev = Device::Host);

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const;  // 0 for the empty (0-d) tensor
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Elements in one index of the first dimension (e.g. one row of a matrix, one expert of a stack).
  int64_t inner() const { return ndim == 0 ? 1 : numel() / shape[0]; }
  // View of rows [begin, begin+count) of the first dimension.
  Tensor slice0(int64_t begin, int64_t count) const;
  // Same memory with another shape of the same element count.
  Tensor reshape(std::initializer_list<int64_t> dims) const;
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  std::string shape_str() const;
};

// Host memory owned by the holder, 64-byte aligned.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  void* data() const { return mem_.get(); }
  size_t size() const { return size_; }
  Tensor tensor(DType t, std::initializer_list<int64_t> dims) const;

 private:
  struct Free { void operator()(void* p) const; };
  std::unique_ptr<void, Free> mem_;
  size_t size_ = 0;
};

}  // namespace fern
