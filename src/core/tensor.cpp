#include "core/tensor.h"

#include <cstdlib>

namespace fern {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::U32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::U16: case DType::I16: return 2;
    case DType::U8: case DType::I8: case DType::BOOL: return 1;
    case DType::I64: case DType::F64: case DType::U64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::U32: return "U32";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    case DType::BOOL: return "BOOL";
    case DType::I8: return "I8";
    case DType::U16: return "U16";
    case DType::I16: return "I16";
    case DType::U64: return "U64";
  }
  return "?";
}

Tensor::Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev)
    : Tensor(d, t, std::vector<int64_t>(dims), dev) {}

Tensor::Tensor(void* d, DType t, const std::vector<int64_t>& dims, Device dev) : data(d), dtype(t), device(dev) {
  FERN_CHECK(dims.size() <= kMaxDims, "tensor rank {} > {}", dims.size(), kMaxDims);
  ndim = static_cast<int>(dims.size());
  for (int i = 0; i < ndim; ++i) shape[i] = dims[i];
}

int64_t Tensor::numel() const {
  if (ndim == 0) return 0;  // the default (empty) tensor; fern has no 0-d tensors
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

Tensor Tensor::slice0(int64_t begin, int64_t count) const {
  FERN_CHECK(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0], "slice0 [{}, +{}) of {}", begin,
             count, shape_str());
  Tensor t = *this;
  t.shape[0] = count;
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin) * static_cast<size_t>(inner()) * dtype_size(dtype);
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dtype, dims, device);
  FERN_CHECK(t.numel() == numel(), "reshape {} -> {} elements", shape_str(), t.numel());
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) fail("out of host memory allocating {} bytes", bytes);
  mem_.reset(p);
}

void HostBuffer::Free::operator()(void* p) const { std::free(p); }

Tensor HostBuffer::tensor(DType t, std::initializer_list<int64_t> dims) const {
  Tensor r(mem_.get(), t, dims);
  FERN_CHECK(r.nbytes() <= size_, "tensor {} bytes > buffer {}", r.nbytes(), size_);
  return r;
}

}  // namespace fern
