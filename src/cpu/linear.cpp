// Dense (bf16/f32) and MLX affine (4/8-bit) matrix products: out = x W^T. A block of weight rows is dequantized
// into a small per-thread buffer and then multiplied with every input row, so the weight is read once per call
// and never copied whole.
#include <algorithm>
#include <cstring>
#include <optional>
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

namespace {

// Affine weights are multiplied group by group without forming W: with the codes q of a group as floats,
//   sum_k x_k (s q_k + b) = s (q . x) + b sum_k x_k.
// Codes are read word-parallel: lane m holds word m of the group and code r of every word is taken in turn. x is
// permuted once per call into that order, xp[j*g + r*W + m] = x[j*g + P*m + r] (P codes per word, W words per
// group), so each group is W lanes of contiguous products, summed lane by lane in a fixed order.
struct AffineLayout {
  int64_t g, ng, P, W;
  explicit AffineLayout(const LinearWeight& w)
      : g(w.group_size), ng(w.in / w.group_size), P(32 / w.bits), W(w.group_size / (32 / w.bits)) {}
};

void permute_input(const AffineLayout& L, const float* x, float* xp, float* xsum) {
  for (int64_t j = 0; j < L.ng; ++j) {
    const float* xg = x + j * L.g;
    float* pg = xp + j * L.g;
    for (int64_t r = 0; r < L.P; ++r)
      for (int64_t m = 0; m < L.W; ++m) pg[r * L.W + m] = xg[L.P * m + r];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < L.g; ++k) s += xg[k];
    xsum[j] = s;
  }
}

constexpr int64_t kMaxLanes = 64;   // W = group_size * bits / 32 <= 64 for groups up to 256 at 8 bits
constexpr int64_t kMaxGroups = 64;  // groups whose scales are converted at once

// One group's q . x, the codes either still packed (CodeFromWords) or unpacked earlier (CodeFromFloats): the same
// float operations in the same order either way, so decode and prefill give bitwise-equal rows.
struct CodeFromWords {
  const uint32_t* words;
  int bits;
  uint32_t mask;
  float operator()(int64_t r, int64_t m) const { return static_cast<float>((words[m] >> (int(r) * bits)) & mask); }
};
struct CodeFromFloats {
  const float* q;
  int64_t W;
  float operator()(int64_t r, int64_t m) const { return q[r * W + m]; }
};

// P and W are template parameters for the common layouts (g64 at 4 and 8 bits) so the lane loop is fully unrolled
// and vectorized; 0 means "use the runtime values".
template <int kP, int kW, class Code>
FERN_CPU_INLINE float group_dot(const Code& code, const float* xp, int64_t P_rt, int64_t W_rt) {
  const int64_t P = kP ? kP : P_rt, W = kW ? kW : W_rt;
  float acc[kW ? kW : kMaxLanes];
  for (int64_t m = 0; m < W; ++m) acc[m] = 0.0f;
  for (int64_t r = 0; r < P; ++r) {
    const float* xr = xp + r * W;
#pragma omp simd
    for (int64_t m = 0; m < W; ++m) acc[m] += code(r, m) * xr[m];
  }
  float s = 0.0f;
  for (int64_t m = 0; m < W; ++m) s += acc[m];
  return s;
}

// Codes of row n, in the permuted order, as floats (for calls with several input rows).
FERN_CPU_INLINE void unpack_codes(const LinearWeight& w, const AffineLayout& L, int64_t n, float* qb) {
  const uint32_t* q = w.w.ptr<uint32_t>() + n * (w.in * w.bits / 32);
  const CodeFromWords code{nullptr, w.bits, (1u << w.bits) - 1u};
  for (int64_t j = 0; j < L.ng; ++j) {
    CodeFromWords c = code;
    c.words = q + j * L.W;
    float* d = qb + j * L.g;
    for (int64_t r = 0; r < L.P; ++r)
#pragma omp simd
      for (int64_t m = 0; m < L.W; ++m) d[r * L.W + m] = c(r, m);
  }
}

// out[t, n] for input rows t in [t0, t1), the row's codes packed (`row`, when qb is null) or unpacked (`qb`).
template <int kP, int kW>
FERN_CPU_INLINE void affine_row(float* out, const float* xp, const float* xsum, const LinearWeight& w,
                                const AffineLayout& L, int64_t n, const uint32_t* row, const float* qb, int64_t t0,
                                int64_t t1) {
  const int64_t N = w.out, K = w.in, ng = L.ng;
  const uint32_t mask = (1u << w.bits) - 1u;
  float sc[kMaxGroups], bi[kMaxGroups];
  for (int64_t j0 = 0; j0 < ng; j0 += kMaxGroups) {
    // Scales and biases of up to kMaxGroups groups, converted once for all the input rows.
    const int64_t nj = std::min(kMaxGroups, ng - j0);
    for (int64_t j = 0; j < nj; ++j) {
      sc[j] = load_f(w.scales, n * ng + j0 + j);
      bi[j] = load_f(w.biases, n * ng + j0 + j);
    }
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = xp + t * K;
      const float* xs = xsum + t * ng;
      float acc = j0 == 0 ? 0.0f : out[t * N + n];
      for (int64_t j = 0; j < nj; ++j) {
        const int64_t jj = j0 + j;
        const float d = qb ? group_dot<kP, kW>(CodeFromFloats{qb + jj * L.g, L.W}, xr + jj * L.g, L.P, L.W)
                           : group_dot<kP, kW>(CodeFromWords{row + jj * L.W, w.bits, mask}, xr + jj * L.g, L.P,
                                               L.W);
        acc += sc[j] * d + bi[j] * xs[jj];
      }
      out[t * N + n] = acc;
    }
  }
}

// Rows [n0, n0 + nr) of an affine product. A single input row reads the packed words directly. With several, the
// block's codes are unpacked into `buf` (nr * K floats) once, and the input rows are taken a tile at a time so
// that a tile of x stays in cache while every row of the block passes over it.
template <int kP, int kW>
FERN_CPU_INLINE void affine_rows_impl(float* out, const float* xp, const float* xsum, int64_t T,
                                      const LinearWeight& w, const AffineLayout& L, int64_t n0, int64_t nr,
                                      float* buf) {
  constexpr int64_t kTile = 16;
  const int64_t K = w.in, words_per_row = K * w.bits / 32;
  const uint32_t* words = w.w.ptr<uint32_t>();
  if (T == 1) {
    for (int64_t n = n0; n < n0 + nr; ++n)
      affine_row<kP, kW>(out, xp, xsum, w, L, n, words + n * words_per_row, nullptr, 0, 1);
    return;
  }
  for (int64_t r = 0; r < nr; ++r) unpack_codes(w, L, n0 + r, buf + r * K);
  for (int64_t t0 = 0; t0 < T; t0 += kTile)
    for (int64_t r = 0; r < nr; ++r)
      affine_row<kP, kW>(out, xp, xsum, w, L, n0 + r, nullptr, buf + r * K, t0, std::min(T, t0 + kTile));
}

FERN_CPU_CLONES
void affine_rows(float* out, const float* xp, const float* xsum, int64_t T, const LinearWeight& w,
                 const AffineLayout& L, int64_t n0, int64_t nr, float* buf) {
  if (w.bits == 4 && L.W == 8)
    affine_rows_impl<8, 8>(out, xp, xsum, T, w, L, n0, nr, buf);
  else if (w.bits == 8 && L.W == 16)
    affine_rows_impl<4, 16>(out, xp, xsum, T, w, L, n0, nr, buf);
  else
    affine_rows_impl<0, 0>(out, xp, xsum, T, w, L, n0, nr, buf);
}

// Rows [n0, n0 + nr) of a dense product, each row converted to fp32 once.
FERN_CPU_CLONES
void dense_rows(float* out, const float* x, int64_t T, const LinearWeight& w, int64_t n0, int64_t nr, float* buf) {
  const int64_t N = w.out, K = w.in;
  for (int64_t r = 0; r < nr; ++r) dequant_row(w, n0 + r, buf + r * K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < nr; ++r) out[t * N + n0 + r] = dot(buf + r * K, x + t * K, K);
}

}  // namespace

void linear(float* out, const float* x, int64_t T, const LinearWeight& w, int nt) {
  validate_linear(w);
  const int64_t N = w.out, K = w.in;
  const bool affine = w.kind == LinearWeight::Kind::Affine;
  // Rows per block: each input row is reused from L1 for the whole block.
  constexpr int64_t kRows = 8;
  const int64_t nblocks = (N + kRows - 1) / kRows;
  std::optional<AffineLayout> L;
  std::vector<float> xp, xsum;
  if (affine) {
    L.emplace(w);
    if (L->W > kMaxLanes) fail("linear weight {}: group size {} too large", w.name, w.group_size);
    xp.resize(T * K);
    xsum.resize(T * L->ng);
    for (int64_t t = 0; t < T; ++t) permute_input(*L, x + t * K, &xp[t * K], &xsum[t * L->ng]);
  }
  const bool par = N * K * T >= kParallelWork && nblocks > 1;
#pragma omp parallel num_threads(nt) if (par)
  {
    std::vector<float> buf(kRows * K);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t n0 = blk * kRows, nr = std::min(kRows, N - n0);
      if (affine)
        affine_rows(out, xp.data(), xsum.data(), T, w, *L, n0, nr, buf.data());
      else
        dense_rows(out, x, T, w, n0, nr, buf.data());
    }
  }
}

}  // namespace fern::cpu
