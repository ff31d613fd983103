// Error reporting for the CUDA code, usable from plain C++ and from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include <string>

namespace fern::cuda {

// Whether p is on a 16-byte boundary (what float4 / uint4 accesses and cp.async of 16 bytes need).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Throw fern::Error / fern::InternalError (defined in errors.cpp: nvcc's front end cannot compile fmt's
// compile-time format strings, so .cu files never format messages themselves).
[[noreturn]] void raise_error(const std::string& msg);
[[noreturn]] void raise_internal(const std::string& msg);
// Throws fern::Error naming the CUDA call that failed (never aborts: the server must survive a bad request).
void check(cudaError_t e, const char* what, const char* file, int line);

}  // namespace fern::cuda

// An internal invariant in .cu code (like FERN_CHECK, without formatting).
#define FERN_CU_CHECK(cond, msg)                                                        \
  do {                                                                                  \
    if (!(cond)) ::fern::cuda::raise_internal(std::string(msg) + " (" + #cond + ")");  \
  } while (0)

#define FERN_CUDA_CHECK(call) ::fern::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports configuration errors (bad grid, too much shared memory) at the launch site.
#define FERN_CUDA_LAUNCH_CHECK(name) ::fern::cuda::check(cudaGetLastError(), name, __FILE__, __LINE__)
