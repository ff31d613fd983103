// Dense (bf16/f32) and MLX affine (4/8-bit) matrix products: out = x W^T. Affine weights are multiplied straight
// from their packed codes, each code converted once for up to four input rows; a block of dense rows is converted
// into a small per-thread buffer and then multiplied with every input row. Either way the weight is read once per
// call and never copied whole.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>
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
//   sum_k x_k (s q_k + b) = s (q . x) + b sum_k x_k,
// both terms per lane of the group (below), so that they meet, and mostly cancel (b is about -8 s), before the
// group's share is added to the output.
// Codes are read word-parallel: lane m holds word m of the group and code r of every word is taken in turn. Code r
// is not shifted down: word & (mask << bits r) is exactly the float q 2^(bits r), and x is scaled by 2^-(bits r) to
// match, so each product is the same q x (a power-of-two scaling is exact) for one instruction less per code. The
// top code is shifted down instead (its mask would reach the sign bit of the conversion). x is permuted and scaled
// once per call into that order, xp[j*g + r*W + m] = x[j*g + P*m + r] 2^-(bits r) (P codes per word, W words per
// group; no scaling for r = P - 1), so each group is W lanes of contiguous products.
struct AffineLayout {
  int64_t g, ng, P, W, bits;
  explicit AffineLayout(const LinearWeight& w)
      : g(w.group_size), ng(w.in / w.group_size), P(32 / w.bits), W(w.group_size / (32 / w.bits)), bits(w.bits) {}
  // What code r is multiplied by in xp: 2^-(bits r), or 1 for the top code.
  float code_scale(int64_t r) const { return r == P - 1 ? 1.0f : std::ldexp(1.0f, -int(bits * r)); }
};

void permute_input(const AffineLayout& L, const float* x, float* xp, float* xl) {
  for (int64_t j = 0; j < L.ng; ++j) {
    const float* xg = x + j * L.g;
    float* pg = xp + j * L.g;
    for (int64_t r = 0; r < L.P; ++r) {
      const float c = L.code_scale(r);
      for (int64_t m = 0; m < L.W; ++m) pg[r * L.W + m] = xg[L.P * m + r] * c;
    }
    for (int64_t m = 0; m < L.W; ++m) {
      float s = 0.0f;
      for (int64_t r = 0; r < L.P; ++r) s += xg[L.P * m + r];
      xl[j * L.W + m] = s;
    }
  }
}

constexpr int64_t kMaxLanes = 64;   // W = group_size * bits / 32 <= 64 for groups up to 256 at 8 bits
constexpr int64_t kMaxGroups = 64;  // groups whose scales are converted at once
constexpr int64_t kTile = 16;       // input rows that pass over a block of weight rows together

// Code r of lane m as a float: q 2^(bits r) for r < P - 1 (`low`), q for the top code (`top`). kBits is the code
// width when the caller knows it at compile time (0: the runtime `bits`).
template <int kBits>
struct Codes {
  const uint32_t* words;
  int bits_rt;
  int width() const { return kBits ? kBits : bits_rt; }
  float low(int64_t r, int64_t m) const {
    const uint32_t mask = ((1u << width()) - 1u) << (int(r) * width());
    return static_cast<float>(static_cast<int32_t>(words[m] & mask));
  }
  float top(int64_t P, int64_t m) const { return static_cast<float>(words[m] >> (int(P - 1) * width())); }
};

// For kT input rows at once, v[t][m] += s (lane m's part of one group's q . x_t) + b (lane m's part of the group's
// sum of x_t): each code is converted once and multiplied into every row. Row t's operations are the same, in the
// same order, whatever kT is, so a row's result does not depend on how many rows were taken with it (decode and
// prefill give bitwise-equal rows). The lanes are summed only once per output, after every group: a horizontal sum
// per group would put a chain of dependent additions on every 64 weights. P and W are template parameters for the
// common layouts (g64 at 4 and 8 bits) so the lane loop is fully unrolled and vectorized; 0 means "use the runtime
// values". xp[t] and xl[t] point at the group's permuted x and lane sums of row t.
template <int kP, int kW, int kT>
FERN_CPU_INLINE void group_lanes(const Codes<kP ? 32 / kP : 0>& code, const float* const* xp, const float* const* xl,
                                 int64_t P_rt, int64_t W_rt, float s, float b, float (*v)[kW ? kW : kMaxLanes]) {
  const int64_t P = kP ? kP : P_rt, W = kW ? kW : W_rt;
  float acc[kT][kW ? kW : kMaxLanes];
#pragma omp simd
  for (int64_t m = 0; m < W; ++m) {
    const float c = code.low(0, m);
    for (int t = 0; t < kT; ++t) acc[t][m] = c * xp[t][m];
  }
  for (int64_t r = 1; r < P - 1; ++r) {
#pragma omp simd
    for (int64_t m = 0; m < W; ++m) {
      const float c = code.low(r, m);
      for (int t = 0; t < kT; ++t) acc[t][m] += c * xp[t][r * W + m];
    }
  }
#pragma omp simd
  for (int64_t m = 0; m < W; ++m) {
    const float c = code.top(P, m);
    for (int t = 0; t < kT; ++t) v[t][m] += s * (acc[t][m] + c * xp[t][(P - 1) * W + m]) + b * xl[t][m];
  }
}

// The sum of W lanes by halving (lane m + h into lane m, h = ceil(W / 2), and again on the first h lanes): a fixed
// order, so the bits do not depend on the compiler, with a chain of log2 W additions instead of W.
FERN_CPU_INLINE float lane_sum(float* l, int64_t W) {
  while (W > 1) {
    const int64_t h = (W + 1) / 2;
#pragma omp simd
    for (int64_t m = 0; m < W - h; ++m) l[m] += l[m + h];
    W = h;
  }
  return l[0];
}

// out[t, n] for kT input rows t0.. of one weight row (`row`, its packed words): per input row, the lane sums of
// every group, then the lanes summed in order.
template <int kP, int kW, int kT>
FERN_CPU_INLINE void affine_row(float* out, const float* xp, const float* xl, const LinearWeight& w,
                                const AffineLayout& L, int64_t n, const uint32_t* row, int64_t t0) {
  constexpr int64_t kLanes = kW ? kW : kMaxLanes;
  const int64_t N = w.out, K = w.in, ng = L.ng, W = kW ? kW : L.W;
  const int64_t lanes_per_row = ng * W;
  float sc[kMaxGroups], bi[kMaxGroups];
  float lanes[kT][kLanes];
  const float* xr[kT];
  const float* xs[kT];
  for (int t = 0; t < kT; ++t) std::fill_n(lanes[t], W, 0.0f);
  for (int64_t j0 = 0; j0 < ng; j0 += kMaxGroups) {
    // Scales and biases of up to kMaxGroups groups, converted once for all the input rows.
    const int64_t nj = std::min(kMaxGroups, ng - j0);
    for (int64_t j = 0; j < nj; ++j) {
      sc[j] = load_f(w.scales, n * ng + j0 + j);
      bi[j] = load_f(w.biases, n * ng + j0 + j);
    }
    for (int64_t j = 0; j < nj; ++j) {
      const int64_t jj = j0 + j;
      for (int t = 0; t < kT; ++t) {
        xr[t] = xp + (t0 + t) * K + jj * L.g;
        xs[t] = xl + (t0 + t) * lanes_per_row + jj * W;
      }
      group_lanes<kP, kW, kT>(Codes<kP ? 32 / kP : 0>{row + jj * L.W, w.bits}, xr, xs, L.P, L.W, sc[j], bi[j],
                              lanes);
    }
  }
  for (int t = 0; t < kT; ++t) out[(t0 + t) * N + n] = lane_sum(lanes[t], W);
}

// Rows [n0, n0 + nr) of an affine product, straight from the packed words. The input rows are taken a tile at a
// time, so that a tile of x stays in cache while every row of the block passes over it, and within a tile four at
// a time (each code converted once for up to four products).
template <int kP, int kW>
FERN_CPU_INLINE void affine_rows_impl(float* out, const float* xp, const float* xl, int64_t T,
                                      const LinearWeight& w, const AffineLayout& L, int64_t n0, int64_t nr) {
  constexpr int kT = 4;
  const int64_t words_per_row = w.in * w.bits / 32;
  const uint32_t* words = w.w.ptr<uint32_t>();
  for (int64_t t0 = 0; t0 < T; t0 += kTile) {
    const int64_t t1 = std::min(T, t0 + kTile);
    for (int64_t n = n0; n < n0 + nr; ++n) {
      const uint32_t* row = words + n * words_per_row;
      int64_t t = t0;
      for (; t + kT <= t1; t += kT) affine_row<kP, kW, kT>(out, xp, xl, w, L, n, row, t);
      if (t1 - t == 3) affine_row<kP, kW, 3>(out, xp, xl, w, L, n, row, t);
      if (t1 - t == 2) affine_row<kP, kW, 2>(out, xp, xl, w, L, n, row, t);
      if (t1 - t == 1) affine_row<kP, kW, 1>(out, xp, xl, w, L, n, row, t);
    }
  }
}

FERN_CPU_CLONES
void affine_rows(float* out, const float* xp, const float* xl, int64_t T, const LinearWeight& w,
                 const AffineLayout& L, int64_t n0, int64_t nr) {
  if (w.bits == 4 && L.W == 8)
    affine_rows_impl<8, 8>(out, xp, xl, T, w, L, n0, nr);
  else if (w.bits == 8 && L.W == 16)
    affine_rows_impl<4, 16>(out, xp, xl, T, w, L, n0, nr);
  else
    affine_rows_impl<0, 0>(out, xp, xl, T, w, L, n0, nr);
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

void linear_many(std::span<const LinearJob> jobs, int nt) {
  // Rows per block: each input row is reused from L1 for the whole block.
  constexpr int64_t kRows = 8;
  struct Prepared {
    std::optional<AffineLayout> L;
    std::vector<float> xp, xl;  // affine: x permuted and scaled, its lane sums (unless an earlier job's serve)
    const float* xp_at = nullptr;
    const float* xl_at = nullptr;
    int64_t first_block = 0;
  };
  // Two affine jobs read the same permutation when they take the same input rows in the same layout.
  auto same_input = [&](const LinearJob& a, const LinearJob& b) {
    return a.x == b.x && a.T == b.T && a.w->kind == b.w->kind && a.w->in == b.w->in &&
           a.w->group_size == b.w->group_size && a.w->bits == b.w->bits;
  };
  std::vector<Prepared> prep(jobs.size());
  int64_t nblocks = 0, work = 0, K_max = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const LinearJob& j = jobs[i];
    validate_linear(*j.w);
    const int64_t K = j.w->in;
    Prepared& p = prep[i];
    if (j.w->kind == LinearWeight::Kind::Affine) {
      p.L.emplace(*j.w);
      if (p.L->W > kMaxLanes) fail("linear weight {}: group size {} too large", j.w->name, j.w->group_size);
      // An expert's gate and up, a layer's projections: one permutation of their shared input.
      for (size_t e = 0; e < i && !p.xp_at; ++e)
        if (same_input(jobs[e], j)) {
          p.xp_at = prep[e].xp_at;
          p.xl_at = prep[e].xl_at;
        }
      if (!p.xp_at) {
        p.xp.resize(j.T * K);
        p.xl.resize(j.T * p.L->ng * p.L->W);
        for (int64_t t = 0; t < j.T; ++t)
          permute_input(*p.L, j.x + t * K, &p.xp[t * K], &p.xl[t * p.L->ng * p.L->W]);
        p.xp_at = p.xp.data();
        p.xl_at = p.xl.data();
      }
    } else {
      K_max = std::max(K_max, K);
    }
    p.first_block = nblocks;
    nblocks += j.T > 0 ? (j.w->out + kRows - 1) / kRows : 0;
    work += j.w->out * K * j.T;
  }
  const bool par = work >= kParallelWork && nblocks > 1;
  // Every output is computed by one thread the same way whichever thread it is, so the schedule does not change
  // the bits. Blocks of equal cost (one job, or jobs of the same rows and width: a layer's projections) are split
  // statically; else dynamically (a MoE batch: experts with different row counts).
  bool uniform = true;
  for (const LinearJob& j : jobs) uniform = uniform && j.T == jobs[0].T && j.w->in == jobs[0].w->in;
  const int64_t chunk = std::max<int64_t>(1, nblocks / (std::max(nt, 1) * 8));
#pragma omp parallel num_threads(nt) if (par)
  {
    std::vector<float> buf(K_max * kRows);  // dense rows converted to fp32
    size_t i = 0;
    auto block = [&](int64_t blk) {
      while (i + 1 < jobs.size() && prep[i + 1].first_block <= blk) ++i;
      while (prep[i].first_block > blk) --i;
      const LinearJob& j = jobs[i];
      const int64_t n0 = (blk - prep[i].first_block) * kRows, nr = std::min(kRows, j.w->out - n0);
      if (prep[i].L)
        affine_rows(j.out, prep[i].xp_at, prep[i].xl_at, j.T, *j.w, *prep[i].L, n0, nr);
      else
        dense_rows(j.out, j.x, j.T, *j.w, n0, nr, buf.data());
    };
    if (uniform) {
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < nblocks; ++blk) block(blk);
    } else {
#pragma omp for schedule(dynamic, chunk)
      for (int64_t blk = 0; blk < nblocks; ++blk) block(blk);
    }
  }
}

void linear(float* out, const float* x, int64_t T, const LinearWeight& w, int nt) {
  const LinearJob job{out, x, T, &w};
  linear_many({&job, 1}, nt);
}

}  // namespace fern::cpu
