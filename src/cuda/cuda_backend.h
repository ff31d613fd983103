// The CUDA backend (declarations only, so that code built without CUDA can include this header; the definitions
// exist when the build defines FERN_HAVE_CUDA).
#pragma once
#include <memory>

#include "ops/backend.h"

namespace fern {

// True when a CUDA device can be used.
bool cuda_available();
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace fern
