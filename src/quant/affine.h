// MLX affine group quantization (MODEL.md 3b), shared by the quantizer, the synthetic checkpoint generator, the
// loader's checks and the CPU backend. Per group of `group` values w (the bf16 weight, computed in fp32), as
// MLX's GPU kernels do it: max = max(0, w...), min = min(w...);
//   s = max((max - min) / (2^bits - 1), 1e-7); the extreme of larger magnitude is the edge; s is negated when
//   the edge is the maximum; q0 = round(edge / s); if q0 != 0 { s = edge / q0; bias = edge } else bias = 0;
//   q = clip(round((w - bias) / s), 0, 2^bits - 1).   Dequantized: w' = bf16(s) * q + bf16(bias).
// round is half away from zero. Words pack 32/bits values from the least significant bits up.
// Error bound: with N = 2^bits - 1 and s0 = (max - min)/N, |edge|/s0 lies in (N/2, N] (max >= 0 >= ... and the
// edge is the larger extreme), so q0 = round(|edge|/s0) gives s0/|s| <= 1 + 1/N: the range N|s| may fall short
// of max - min by up to |s| and the far extreme then clips. In fp32, |w - (s q + bias)| <= |s|/2 where the code
// q is inside (0, N) and <= |s| where q is 0 or N; bf16 storage of s and bias adds at most 2^-9 (N|s| + |bias|).
// Tested by tests/model/test_quant_affine.cpp.
#pragma once
#include <cstdint>

namespace fern {

struct AffineGroup {
  float scale = 0;  // fp32, before the bf16 rounding of storage
  float bias = 0;
};

// Quantizes one group of `group` values into q[0..group) (unpacked codes 0..2^bits-1).
AffineGroup quantize_group(const float* w, int group, int bits, uint8_t* q);

// Quantizes a row of `n` values (n % group == 0, group % (32/bits) == 0): packed words [n*bits/32], scales and
// biases stored as bf16 [n/group].
void quantize_row(const float* w, int64_t n, int bits, int group, uint32_t* packed, uint16_t* scales_bf16,
                  uint16_t* biases_bf16);

// Dequantizes one row of `n` values from packed words and bf16 scales/biases into fp32.
void dequantize_row(const uint32_t* packed, const uint16_t* scales_bf16, const uint16_t* biases_bf16, int64_t n,
                    int bits, int group, float* out);

// Unpacked code of element k of a packed row.
inline uint32_t affine_code(const uint32_t* packed, int64_t k, int bits) {
  const int per_word = 32 / bits;
  return (packed[k / per_word] >> ((k % per_word) * bits)) & ((1u << bits) - 1u);
}

}  // namespace fern
