// Switches read from the environment: the benchmark and ablation knobs of the backends (FERN_CUDA_*, FERN_GEMM*,
// FERN_MOE_*, FERN_GDN_*, FERN_ATTN_*). A value a switch does not take is an error that names the switch and what it
// takes (fern::Error): a typo must not silently measure the default. Plain C++ without fmt, so that .cu files can
// include it (nvcc's front end cannot compile fmt's compile-time format strings).
#pragma once
#include <initializer_list>
#include <string_view>

namespace fern {

// The index in `choices` of the switch's value; `fallback` where it is unset or empty.
int env_choice(const char* name, std::initializer_list<std::string_view> choices, int fallback);

// The switch's value as a whole number in [lo, hi]; `fallback` where it is unset or empty.
long env_int(const char* name, long lo, long hi, long fallback);

}  // namespace fern
