// Double-precision references shared by the CPU op tests, written independently of the backend's kernels.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "model/weights.h"

namespace fern::test {

inline double ref_value(const Tensor& t, int64_t i) {
  return t.dtype == DType::BF16 ? bf16_to_f32(t.ptr<uint16_t>()[i]) : t.ptr<float>()[i];
}

// W[n, k] of a plain weight in double: for affine weights the code of column k sits in bits
// [bits*k, bits*k + bits) of the row's packed bit string (LSB-first words).
inline double ref_weight(const LinearWeight& w, int64_t n, int64_t k) {
  if (w.kind == LinearWeight::Kind::Dense) return ref_value(w.w, n * w.in + k);
  const int64_t bitpos = k * w.bits, words = w.in * w.bits / 32;
  const uint32_t word = w.w.ptr<uint32_t>()[n * words + bitpos / 32];
  const uint32_t code = (word >> (bitpos % 32)) & ((1u << w.bits) - 1u);
  const int64_t ng = w.in / w.group_size, gi = n * ng + k / w.group_size;
  return ref_value(w.scales, gi) * code + ref_value(w.biases, gi);
}

// y = x W^T in double for R rows.
inline std::vector<double> ref_linear(const std::vector<double>& x, int64_t R, const LinearWeight& w) {
  std::vector<double> out(R * w.out);
  std::vector<double> row(w.in);
  for (int64_t n = 0; n < w.out; ++n) {
    for (int64_t k = 0; k < w.in; ++k) row[k] = ref_weight(w, n, k);
    for (int64_t r = 0; r < R; ++r) {
      double s = 0;
      for (int64_t k = 0; k < w.in; ++k) s += x[r * w.in + k] * row[k];
      out[r * w.out + n] = s;
    }
  }
  return out;
}

inline double ref_sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
inline double ref_silu(double x) { return x * ref_sigmoid(x); }

inline std::vector<float> to_float(const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); }
inline std::vector<double> to_double(const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); }

}  // namespace fern::test
