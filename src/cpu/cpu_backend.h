// The CPU backend: fp32 arithmetic on bf16 or dequantized weights, multi-threaded with OpenMP. It is the
// numerical reference for every GPU kernel.
#pragma once
#include <memory>

#include "ops/backend.h"

namespace fern {

// threads = 0: OpenMP's default (all cores).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace fern
