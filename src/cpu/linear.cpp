// Dense (bf16/f32) and MLX affine (4/8-bit) matrix products: out = x W^T. A block of weight rows is dequantized
// into a small per-thread buffer and then multiplied with every input row, so the weight is read once per call
// and never copied whole.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {
namespace {

bool float_like(DType t) { return t == DType::BF16 || t == DType::F32; }

// Element i of a BF16 or F32 vector as float.
inline float load_f(const Tensor& t, int64_t i) {
  return t.dtype == DType::BF16 ? bf16_to_f32(t.ptr<uint16_t>()[i]) : t.ptr<float>()[i];
}

}  // namespace

void validate_linear(const LinearWeight& w) {
  const std::string& nm = w.name.empty() ? std::string("(unnamed)") : w.name;
  if (w.kind == LinearWeight::Kind::None) fail("linear weight {} is missing", nm);
  if (w.experts != 0) fail("linear weight {}: an expert stack used as one matrix", nm);
  if (w.out <= 0 || w.in <= 0) fail("linear weight {}: bad shape [{}, {}]", nm, w.out, w.in);
  if (w.w.empty() || w.w.ndim != 2) fail("linear weight {}: tensor missing or not 2-D ({})", nm, w.w.shape_str());
  if (w.kind == LinearWeight::Kind::Dense) {
    if (!float_like(w.w.dtype)) fail("linear weight {}: dtype {} (want BF16 or F32)", nm, dtype_name(w.w.dtype));
    if (w.w.dim(0) != w.out || w.w.dim(1) != w.in)
      fail("linear weight {}: tensor {} does not match [{}, {}]", nm, w.w.shape_str(), w.out, w.in);
    return;
  }
  if (w.bits != 4 && w.bits != 8) fail("linear weight {}: {} bits (want 4 or 8)", nm, w.bits);
  if (w.group_size <= 0 || w.in % w.group_size != 0 || w.group_size % (32 / w.bits) != 0)
    fail("linear weight {}: group size {} does not divide {} inputs", nm, w.group_size, w.in);
  if (w.w.dtype != DType::U32) fail("linear weight {}: packed dtype {} (want U32)", nm, dtype_name(w.w.dtype));
  if (w.w.dim(0) != w.out || w.w.dim(1) * 32 != w.in * w.bits)
    fail("linear weight {}: packed tensor {} does not hold [{}, {}] at {} bits", nm, w.w.shape_str(), w.out, w.in,
         w.bits);
  const int64_t ng = w.in / w.group_size;
  for (const Tensor* t : {&w.scales, &w.biases}) {
    const char* what = t == &w.scales ? "scales" : "biases";
    if (t->empty() || t->ndim != 2 || t->dim(0) != w.out || t->dim(1) != ng)
      fail("linear weight {}: {} {} (want [{}, {}])", nm, what, t->shape_str(), w.out, ng);
    if (!float_like(t->dtype)) fail("linear weight {}: {} dtype {}", nm, what, dtype_name(t->dtype));
  }
}

void dequant_row(const LinearWeight& w, int64_t n, float* dst) {
  const int64_t K = w.in;
  if (w.kind == LinearWeight::Kind::Dense) {
    if (w.w.dtype == DType::F32) {
      std::memcpy(dst, w.w.ptr<float>() + n * K, sizeof(float) * K);
    } else {
      const uint16_t* src = w.w.ptr<uint16_t>() + n * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = bf16_to_f32(src[k]);
    }
    return;
  }
  const int64_t g = w.group_size, ng = K / g;
  const int64_t words_per_group = g * w.bits / 32;
  const uint32_t* q = w.w.ptr<uint32_t>() + n * (K * w.bits / 32);
  for (int64_t j = 0; j < ng; ++j) {
    const float s = load_f(w.scales, n * ng + j), b = load_f(w.biases, n * ng + j);
    const uint32_t* qq = q + j * words_per_group;
    float* d = dst + j * g;
    if (w.bits == 4) {
      for (int64_t m = 0; m < words_per_group; ++m) {
        const uint32_t word = qq[m];
        for (int r = 0; r < 8; ++r) d[8 * m + r] = s * static_cast<float>((word >> (4 * r)) & 15u) + b;
      }
    } else {
      for (int64_t m = 0; m < words_per_group; ++m) {
        const uint32_t word = qq[m];
        for (int r = 0; r < 4; ++r) d[4 * m + r] = s * static_cast<float>((word >> (8 * r)) & 255u) + b;
      }
    }
  }
}

void linear(float* out, const float* x, int64_t T, const LinearWeight& w, int nt) {
  validate_linear(w);
  const int64_t N = w.out, K = w.in;
  // Rows per block: enough to reuse each input row from L1 several times, few enough to keep the block in L2.
  constexpr int64_t kRows = 8;
  const int64_t nblocks = (N + kRows - 1) / kRows;
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> buf(kRows * K);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t n0 = blk * kRows, nr = std::min(kRows, N - n0);
      for (int64_t r = 0; r < nr; ++r) dequant_row(w, n0 + r, buf.data() + r * K);
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = x + t * K;
        float* o = out + t * N + n0;
        for (int64_t r = 0; r < nr; ++r) o[r] = dot(buf.data() + r * K, xr, K);
      }
    }
  }
}

}  // namespace fern::cpu
