#include "model/weights.h"

namespace fern {

LinearWeight LinearWeight::expert(int64_t e) const {
  FERN_CHECK(experts > 0 && e >= 0 && e < experts, "expert {} of {} in {}", e, experts, name);
  LinearWeight r = *this;
  r.experts = 0;
  r.expert_stride = 0;
  const int64_t w_inner = w.inner();  // elements of one expert's matrix in w
  const int64_t stride = expert_stride > 0 ? expert_stride : w_inner;
  r.w = Tensor(static_cast<char*>(w.data) + static_cast<size_t>(e * stride) * dtype_size(w.dtype), w.dtype,
               {w.dim(1), w.dim(2)}, w.device);
  if (kind == Kind::Affine) {
    r.scales = scales.slice0(e, 1).reshape({scales.dim(1), scales.dim(2)});
    r.biases = biases.slice0(e, 1).reshape({biases.dim(1), biases.dim(2)});
  }
  return r;
}

}  // namespace fern
