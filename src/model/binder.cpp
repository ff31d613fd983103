#include "model/binder.h"

#include <cstring>

#include "core/bf16.h"
#include "core/error.h"

namespace fern {
namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

Binder::Binder(const TensorSource& src, const LoadOptions& opt, uint64_t total_bytes)
    : src_(src), opt_(opt), total_(total_bytes), storage_(std::make_shared<BoundStorage>()) {
  storage_->files = src.keep_alive();
}

const TensorRef& Binder::need(const std::string& name) const {
  const TensorRef* t = src_.find(name);
  if (!t) fail("{}: required tensor \"{}\" is missing", src_.describe(), name);
  return *t;
}

void Binder::check(const TensorRef& t, const std::vector<int64_t>& shape, std::initializer_list<DType> allowed) const {
  const SafetensorsEntry& e = *t.entry;
  if (e.shape != shape)
    fail("{}: tensor \"{}\" has shape {}, the config implies {}", t.file, e.name, shape_string(e.shape),
         shape_string(shape));
  bool ok = false;
  for (DType d : allowed) ok |= e.dtype && *e.dtype == d;
  if (!ok) {
    std::string want;
    for (DType d : allowed) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    fail("{}: tensor \"{}\" has dtype {}, expected {}", t.file, e.name, e.dtype_name, want);
  }
}

Tensor Binder::alloc(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(n) * dtype_size(dtype));
  storage_->buffers.push_back(buf);
  return Tensor(buf->data(), dtype, shape);
}

Tensor Binder::view(const TensorRef& t, const std::vector<int64_t>& shape) {
  const DType dt = *t.entry->dtype;
  FERN_CHECK(shape.size() <= static_cast<size_t>(Tensor::kMaxDims), "rank of {}", t.entry->name);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.data);
  if (addr % dtype_size(dt) == 0) return Tensor(const_cast<uint8_t*>(t.data), dt, shape);
  // An unaligned offset is legal in safetensors but not for typed loads; such a tensor gets an aligned copy.
  Tensor c = alloc(dt, shape);
  std::memcpy(c.data, t.data, c.nbytes());
  return c;
}

Tensor Binder::to_f32(const TensorRef& t, const std::vector<int64_t>& shape, float add) {
  Tensor out = alloc(DType::F32, shape);
  const int64_t n = out.numel();
  FERN_CHECK(n == t.entry->numel(), "element count of {}", t.entry->name);
  float* o = out.ptr<float>();
  const DType dt = *t.entry->dtype;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (dt == DType::F32) {
      std::memcpy(&v, t.data + i * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + i * 2, 2);
      v = dt == DType::BF16 ? bf16_to_f32(h) : 0.0f;
      FERN_CHECK(dt == DType::BF16, "to_f32 of {}", dtype_name(dt));
    }
    o[i] = v + add;
  }
  return out;
}

LinearWeight Binder::dense(const std::string& name, const std::vector<int64_t>& shape) {
  const TensorRef& t = need(name);
  check(t, shape, {DType::BF16});
  LinearWeight lw;
  lw.kind = LinearWeight::Kind::Dense;
  lw.name = name;
  lw.experts = shape.size() == 3 ? shape[0] : 0;
  lw.out = shape[shape.size() - 2];
  lw.in = shape.back();
  lw.bits = 16;
  lw.w = view(t, shape);
  progress(t);
  return lw;
}

void Binder::progress(const TensorRef& t) {
  done_ += t.entry->end - t.entry->begin;
  if (opt_.progress) opt_.progress(static_cast<size_t>(std::min(done_, total_)), static_cast<size_t>(total_));
}

}  // namespace fern
