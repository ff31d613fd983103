// Helpers shared by the two layout binders (bind_hf.cpp, bind_mlx.cpp): required-tensor lookup with errors that
// name the checkpoint and the tensor, dtype and shape checks against the config, zero-copy views of mapped
// tensors, and small fp32 conversions kept in owned buffers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/loader.h"
#include "model/weights.h"

namespace fern {

// Owns the converted small tensors and keeps the mapped files alive.
struct BoundStorage : WeightStorage {
  std::vector<std::shared_ptr<HostBuffer>> buffers;
  std::shared_ptr<void> files;
};

class Binder {
 public:
  Binder(const TensorSource& src, const LoadOptions& opt, uint64_t total_bytes);

  const TensorRef* find(const std::string& name) const { return src_.find(name); }
  // The tensor or an error naming it.
  const TensorRef& need(const std::string& name) const;
  // Checks the shape (exactly) and that the dtype is one of `allowed`.
  void check(const TensorRef& t, const std::vector<int64_t>& shape, std::initializer_list<DType> allowed) const;
  // A view of the tensor as `dtype` with `shape` (copied into an aligned buffer only if the file offset is not
  // aligned for the dtype).
  Tensor view(const TensorRef& t, const std::vector<int64_t>& shape);
  // The tensor converted to fp32 (`add` added to every value), in an owned buffer, with `shape`.
  Tensor to_f32(const TensorRef& t, const std::vector<int64_t>& shape, float add = 0.0f);
  // An owned buffer for a tensor built by the binder.
  Tensor alloc(DType dtype, const std::vector<int64_t>& shape);
  // Dense bf16 linear weight [.., out, in].
  LinearWeight dense(const std::string& name, const std::vector<int64_t>& shape);

  void progress(const TensorRef& t);
  std::shared_ptr<BoundStorage> storage() const { return storage_; }
  std::string where() const { return src_.describe(); }

 private:
  const TensorSource& src_;
  const LoadOptions& opt_;
  uint64_t total_ = 0, done_ = 0;
  std::shared_ptr<BoundStorage> storage_;
};

void bind_hf(Binder& b, const ModelConfig& cfg, ModelWeights& w);
void bind_mlx(Binder& b, const ModelConfig& cfg, ModelWeights& w);

}  // namespace fern
