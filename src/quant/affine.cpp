#include "quant/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/error.h"

namespace fern {

AffineGroup quantize_group(const float* w, int group, int bits, uint8_t* q) {
  // As MLX's GPU quantize kernels (Metal and CUDA), which made the published checkpoints: fp32 arithmetic, the
  // running maximum starts at 0 (so max >= 0 even for an all-negative group) and rounding is half away from
  // zero. (MLX's CPU fallback rounds ties to even, starts from the true maximum and, in some versions, computes in
  // the weight's dtype; published checkpoints come from the GPU path.)
  float wmax = 0.0f, wmin = w[0];
  for (int i = 0; i < group; ++i) {
    wmax = std::max(wmax, w[i]);
    wmin = std::min(wmin, w[i]);
  }
  const float n_bins = static_cast<float>((1 << bits) - 1);
  float s = std::max((wmax - wmin) / n_bins, 1e-7f);
  // The extreme of larger magnitude is represented exactly: when it is the minimum the codes count up from it
  // (s > 0); when it is the maximum the codes count down from it (s < 0).
  const bool min_is_edge = std::fabs(wmin) > std::fabs(wmax);
  if (!min_is_edge) s = -s;
  const float edge = min_is_edge ? wmin : wmax;
  const float q0 = std::round(edge / s);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    s = edge / q0;
    bias = edge;
  }
  for (int i = 0; i < group; ++i) {
    float v = std::round((w[i] - bias) / s);
    v = std::min(std::max(v, 0.0f), n_bins);
    q[i] = static_cast<uint8_t>(v);
  }
  return {s, bias};
}

void quantize_row(const float* w, int64_t n, int bits, int group, uint32_t* packed, uint16_t* scales_bf16,
                  uint16_t* biases_bf16) {
  FERN_CHECK((bits == 4 || bits == 8) && group > 0 && group <= 256 && n % group == 0 && group % (32 / bits) == 0,
             "quantize_row n={} bits={} group={}", n, bits, group);
  const int per_word = 32 / bits;
  uint8_t q[256];
  for (int64_t g = 0; g < n / group; ++g) {
    AffineGroup a = quantize_group(w + g * group, group, bits, q);
    scales_bf16[g] = f32_to_bf16(a.scale);
    biases_bf16[g] = f32_to_bf16(a.bias);
    uint32_t* out = packed + g * group / per_word;
    for (int i = 0; i < group / per_word; ++i) {
      uint32_t word = 0;
      for (int r = 0; r < per_word; ++r) word |= static_cast<uint32_t>(q[i * per_word + r]) << (r * bits);
      out[i] = word;
    }
  }
}

void dequantize_row(const uint32_t* packed, const uint16_t* scales_bf16, const uint16_t* biases_bf16, int64_t n,
                    int bits, int group, float* out) {
  for (int64_t k = 0; k < n; ++k) {
    const float s = bf16_to_f32(scales_bf16[k / group]);
    const float b = bf16_to_f32(biases_bf16[k / group]);
    out[k] = s * static_cast<float>(affine_code(packed, k, bits)) + b;
  }
}

}  // namespace fern
