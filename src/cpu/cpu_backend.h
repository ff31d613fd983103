// The CPU backend: fp32 arithmetic on bf16 or dequantized weights, multi-threaded with OpenMP. It is the
// numerical reference for every GPU kernel.
#pragma once
#include <memory>

#include "ops/backend.h"

namespace fern {

// Which form of the delta rule gdn_core runs (MODEL.md 2.4). Auto: chunked when T > 1, recurrent when T == 1.
// The forced forms exist so that tests can compare the two on the same inputs.
enum class GdnForm { Auto, Recurrent, Chunked };

struct CpuBackendOptions {
  int threads = 0;                  // 0: OpenMP's default (all cores)
  GdnForm gdn_form = GdnForm::Auto;
};

// threads = 0: OpenMP's default (all cores).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opt);

}  // namespace fern
