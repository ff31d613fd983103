// rmsnorm_xbf_q4 and gated_norm_xbf_q4 (gemm_wg.h: the RMSNorm, or the GDN core's gated norm, computed straight
// into the exact-code GEMM's input rows) against the two launches each replaces, rmsnorm (or add_rmsnorm, or
// gdn_gated_norm) then to_xbf_q4: every byte of the rows' workspace (hi, lo, the 64-wide sums, the q4b sums' bf16
// pieces and their padding), the plain bf16 hi/lo rows against to_xbf's, the normed fp32 rows and the residual, bit
// for bit, in each row form (q4, q4b, q4h), at the model's widths and at awkward ones. Also the rows against the
// CPU's rmsnorm (or the gated norm's formula in double), so that a bug shared by both GPU paths (e.g. in the
// conversion they share) still fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cuda/gemm_wg.h"
#include "cuda/kernels.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

// One row form of the exact-code loop (xbf_carve's flags).
struct Form {
  const char* name;
  bool half, bias_mma;
};
constexpr Form kForms[] = {{"q4", false, false}, {"q4b", false, true}, {"q4h", true, false}};

// hi + lo rebuilt from the rows (K order 0 4 1 5 2 6 3 7 within each 8-wide chunk) against the CPU's normed rows:
// bf16 hi + lo keeps ~2^-17 of each value (NMSE ~1e-11), one fp16 row ~2^-12 (NMSE ~1e-8); a wrong weight, row or
// chunk order gives NMSE ~1.
constexpr double kNmsePair = 1e-9, kNmseHalf = 1e-6;

std::vector<uint8_t> download_bytes(CudaBackend& be, const Tensor& t) {
  std::vector<uint8_t> v(t.nbytes());
  be.copy(Tensor(v.data(), DType::U8, {int64_t(v.size())}), t.reshape({int64_t(v.size())}));
  return v;
}

// A workspace of `bytes` on the device, every byte 0x5a: bytes that no path writes stay equal (and equal to this).
Tensor filled_workspace(CudaBackend& be, size_t bytes) {
  std::vector<uint8_t> fill(bytes, 0x5a);
  Tensor t = be.alloc(DType::U8, {int64_t(bytes)});
  be.copy(t, Tensor(fill.data(), DType::U8, {int64_t(bytes)}));
  return t;
}

// Bytes that differ between two downloads of workspaces of one size.
size_t differing_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_bits_to_f32(uint16_t b) {
  const uint32_t sign = uint32_t(b >> 15) << 31, exp = (b >> 10) & 31, man = b & 1023;
  uint32_t u;
  if (exp == 0) {  // zero or subnormal
    const float f = std::ldexp(float(man), -24);
    return sign ? -f : f;
  }
  if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The fused path's rows (the bytes b of workspace ws carved as out) against the reference's normed rows ref: each
// value hi + lo (or the fp16 row) per row, and the 64-wide sums.
void check_rows(const std::vector<uint8_t>& b, const Tensor& ws, const cuda::X16& out, const Form& form,
                const std::vector<float>& ref, int64_t rows, int64_t K, const std::string& name, size_t diff) {
  const auto base = reinterpret_cast<uintptr_t>(ws.data);
  auto at = [&](const void* p) { return size_t(reinterpret_cast<uintptr_t>(p) - base); };
  const uint16_t* hi = reinterpret_cast<const uint16_t*>(b.data() + at(out.x));
  const uint16_t* lo = form.half ? nullptr : reinterpret_cast<const uint16_t*>(b.data() + at(out.lo));
  const float* sums = reinterpret_cast<const float*>(b.data() + at(out.sums));
  std::vector<float> got(ref.size());
  double sum_err = 0.0, sum_sq = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      // Element k of an 8-wide chunk sits at position 2 (k % 4) + (k % 8) / 4 of the chunk.
      const int64_t pos = r * K + (k / 8) * 8 + 2 * (k % 4) + (k % 8) / 4;
      got[size_t(r * K + k)] = form.half ? f16_bits_to_f32(hi[pos])
                                         : bf16_bits_to_f32(hi[pos]) + bf16_bits_to_f32(lo[pos]);
    }
    for (int64_t g = 0; g < K / 64; ++g) {
      double s = 0.0;
      for (int64_t k = 0; k < 64; ++k) s += ref[size_t(r * K + 64 * g + k)];
      const double e = double(sums[r * (K / 64) + g]) - s;
      sum_err += e * e;
      for (int64_t k = 0; k < 64; ++k) sum_sq += double(ref[size_t(r * K + 64 * g + k)]) * ref[size_t(r * K + 64 * g + k)];
    }
  }
  double e_rows = 0.0;
  for (int64_t r = 0; r < rows; ++r)  // per row: the rows' scales may differ by 1e5
    e_rows = std::max(e_rows, test::nmse(got.data() + r * K, ref.data() + r * K, size_t(K)));
  // The sums: errors of 64 terms each against the terms' squares (~64x a value's error at worst).
  const double e_sums = sum_err / sum_sq;
  std::printf("norm rows %-34s rows NMSE (worst row) %.3e  sums %.3e  differing bytes %zu\n", name.c_str(), e_rows,
              e_sums, diff);
  EXPECT_LT(e_rows, form.half ? kNmseHalf : kNmsePair);
  EXPECT_LT(e_sums, 64 * (form.half ? kNmseHalf : kNmsePair));
}

void run_case(int64_t rows, int64_t K, const Form& form, bool with_resid) {
  const std::string name = std::string(form.name) + (with_resid ? " resid" : " x") + " K=" + std::to_string(K) +
                           " rows=" + std::to_string(rows);
  SCOPED_TRACE(name);
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  const cuda::Ctx c = test::gpu_ctx(*gpu);

  // Rows of different scales (1e-3 .. 1e2), so that a wrong per-row factor shows; norm weights around 1.
  std::vector<float> x = test::randn(size_t(rows * K), 900 + uint64_t(K) + uint64_t(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) x[size_t(r * K + k)] *= std::pow(10.0f, float(r % 6) - 3.0f);
  std::vector<float> delta = test::randn(size_t(rows * K), 1900 + uint64_t(K), 0.5f);
  auto nw = test::randn(size_t(K), 57 + uint64_t(K), 0.3f);
  for (float& v : nw) v += 1.0f;
  const float eps = 1e-6f;

  const size_t bytes = cuda::xbf_bytes(rows, K);
  Tensor dw = test::upload_f32(*gpu, nw, {K});
  Tensor ws[2], xn[2], resid[2];
  Tensor dx = test::upload_f32(*gpu, x, {rows, K}), dd = test::upload_f32(*gpu, delta, {rows, K});
  for (int i = 0; i < 2; ++i) {
    ws[i] = filled_workspace(*gpu, bytes);
    xn[i] = test::nan_filled(*gpu, rows, K);
    resid[i] = test::upload_f32(*gpu, x, {rows, K});
  }
  cuda::X16 out[2], plain[2];
  Tensor pws[2];
  for (int i = 0; i < 2; ++i) {
    out[i] = cuda::xbf_carve(ws[i].data, rows, K, true, form.half, form.bias_mma);
    pws[i] = filled_workspace(*gpu, bytes);
    plain[i] = cuda::xbf_carve(pws[i].data, rows, K);  // to_xbf's plain bf16 hi/lo rows (another GEMM's input)
  }
  const int R = static_cast<int>(rows), D = static_cast<int>(K);
  // Path 0: the two launches. Path 1: the fused one.
  if (with_resid) {
    cuda::add_rmsnorm(c, resid[0].ptr<float>(), dd.ptr<float>(), xn[0].ptr<float>(), dw.ptr<float>(), R, D, eps);
    cuda::rmsnorm_xbf_q4(c, nullptr, resid[1].ptr<float>(), dd.ptr<float>(), dw.ptr<float>(), eps,
                         xn[1].ptr<float>(), rows, K, out[1], &plain[1]);
  } else {
    cuda::rmsnorm(c, xn[0].ptr<float>(), dx.ptr<float>(), dw.ptr<float>(), R, D, eps);
    cuda::rmsnorm_xbf_q4(c, dx.ptr<float>(), nullptr, nullptr, dw.ptr<float>(), eps, xn[1].ptr<float>(), rows, K,
                         out[1], &plain[1]);
  }
  cuda::to_xbf_q4(c, xn[0].ptr<float>(), rows, K, out[0]);
  cuda::to_xbf(c, xn[0].ptr<float>(), rows, K, plain[0]);
  ASSERT_EQ(cudaStreamSynchronize(c.stream), cudaSuccess);

  const auto b0 = download_bytes(*gpu, ws[0]), b1 = download_bytes(*gpu, ws[1]);
  const size_t diff = differing_bytes(b0, b1);
  EXPECT_EQ(diff, 0u) << "bytes of the rows' workspace differ from rmsnorm + to_xbf_q4";
  const auto p0 = download_bytes(*gpu, pws[0]), p1 = download_bytes(*gpu, pws[1]);
  EXPECT_TRUE(p0 == p1) << "plain rows differ from to_xbf's";
  const auto xn0 = test::download(*gpu, xn[0]), xn1 = test::download(*gpu, xn[1]);
  EXPECT_TRUE(test::same_bits(xn0, xn1)) << "normed rows";
  if (with_resid) {
    EXPECT_TRUE(test::same_bits(test::download(*gpu, resid[0]), test::download(*gpu, resid[1]))) << "residual";
  }

  // Against the CPU: the normed rows of x (or x + delta), then the rows' values and the 64-wide sums.
  std::vector<float> src = x;
  if (with_resid)
    for (size_t i = 0; i < src.size(); ++i) src[i] += delta[i];
  std::vector<float> ref(src.size());
  cpu->rmsnorm(test::host_f32(ref, {rows, K}), test::host_f32(src, {rows, K}), test::host_f32(nw, {K}), eps);
  check_rows(b1, ws[1], out[1], form, ref, rows, K, name, diff);
}

// gated_norm_xbf_q4 (the GDN core's gated norm straight into out_proj's rows) against gdn_gated_norm then
// to_xbf_q4, bit for bit, and against the formula (MODEL.md 2.4 step 9) in double: y / rms(y) w silu(z) per head.
void run_gated_case(int64_t rows, int Hv, int Dv, const Form& form) {
  const int64_t K = int64_t(Hv) * Dv;
  const std::string name = std::string("gated ") + form.name + " Hv=" + std::to_string(Hv) + " Dv=" +
                           std::to_string(Dv) + " rows=" + std::to_string(rows);
  SCOPED_TRACE(name);
  auto gpu = test::make_gpu();
  const cuda::Ctx c = test::gpu_ctx(*gpu);
  // Heads of different scales (1e-3 .. 1e2: the norm must take each head's own), gates of both signs.
  std::vector<float> y = test::randn(size_t(rows * K), 700 + uint64_t(K) + uint64_t(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) y[size_t(r * K + k)] *= std::pow(10.0f, float((r + k / Dv) % 6) - 3.0f);
  const std::vector<float> z = test::randn(size_t(rows * K), 1700 + uint64_t(K), 2.0f);
  auto nw = test::randn(size_t(Dv), 77 + uint64_t(Dv), 0.3f);
  for (float& v : nw) v += 1.0f;
  const float eps = 1e-6f;
  const cuda::GdnShape sh{1, Hv, 64, Dv, 0, 4, eps};  // what the gated norm reads: Hv, Dv, eps

  const size_t bytes = cuda::xbf_bytes(rows, K);
  Tensor ws[2], dy[2];
  cuda::X16 out[2];
  for (int i = 0; i < 2; ++i) {
    ws[i] = filled_workspace(*gpu, bytes);
    out[i] = cuda::xbf_carve(ws[i].data, rows, K, true, form.half, form.bias_mma);
    dy[i] = test::upload_f32(*gpu, y, {rows, K});
  }
  Tensor dz = test::upload_f32(*gpu, z, {rows, K}), dw = test::upload_f32(*gpu, nw, {int64_t(Dv)});
  // Path 0: the norm in place, then the conversion. Path 1: the fused launch (y left as it was).
  cuda::gdn_gated_norm(c, sh, static_cast<int>(rows), dz.ptr<float>(), dw.ptr<float>(), dy[0].ptr<float>());
  cuda::to_xbf_q4(c, dy[0].ptr<float>(), rows, K, out[0]);
  cuda::gated_norm_xbf_q4(c, dy[1].ptr<float>(), dz.ptr<float>(), dw.ptr<float>(), eps, Hv, Dv, rows, out[1]);
  ASSERT_EQ(cudaStreamSynchronize(c.stream), cudaSuccess);

  const auto b0 = download_bytes(*gpu, ws[0]), b1 = download_bytes(*gpu, ws[1]);
  const size_t diff = differing_bytes(b0, b1);
  EXPECT_EQ(diff, 0u) << "bytes of the rows' workspace differ from gdn_gated_norm + to_xbf_q4";
  EXPECT_TRUE(test::same_bits(test::download(*gpu, dy[1]), y)) << "the fused path wrote y";

  std::vector<float> ref(y.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < Hv; ++h) {
      const size_t o = size_t(r * K + int64_t(h) * Dv);
      double ss = 0.0;
      for (int j = 0; j < Dv; ++j) ss += double(y[o + j]) * y[o + j];
      const double inv = 1.0 / std::sqrt(ss / Dv + eps);
      for (int j = 0; j < Dv; ++j) {
        const double zz = z[o + j];
        ref[o + j] = static_cast<float>(y[o + j] * inv * nw[size_t(j)] * (zz / (1.0 + std::exp(-zz))));
      }
    }
  check_rows(b1, ws[1], out[1], form, ref, rows, K, name, diff);
}

TEST(CudaNormRows, MatchNormThenConvert) {
  FERN_REQUIRE_GPU();
  struct Shape {
    int64_t rows, K;
  };
  // The model's width (prefill chunk rows and one row), the narrowest, odd group counts (3, 17: a partial 16-group
  // block of q4b sums), one float4 per thread exactly (1,024), and the widest the norm's register row takes.
  for (const Shape s : {Shape{300, 2048}, Shape{1, 2048}, Shape{37, 64}, Shape{3, 192}, Shape{17, 1088},
                        Shape{5, 1024}, Shape{7, 4096}})
    for (const Form& f : kForms)
      for (bool resid : {false, true}) run_case(s.rows, s.K, f, resid);
}

TEST(CudaNormRows, GatedMatchNormThenConvert) {
  FERN_REQUIRE_GPU();
  struct Shape {
    int64_t rows;
    int Hv, Dv;
  };
  // The model's (32 heads of 128: four blocks of 8 heads per row), a head count that leaves a partial block of heads
  // (3, 11), the narrowest and widest heads, one row.
  for (const Shape s : {Shape{300, 32, 128}, Shape{1, 32, 128}, Shape{37, 3, 64}, Shape{9, 11, 256},
                        Shape{5, 16, 192}})
    for (const Form& f : kForms) run_gated_case(s.rows, s.Hv, s.Dv, f);
}

TEST(CudaNormRows, Refusals) {
  FERN_REQUIRE_GPU();
  EXPECT_TRUE(cuda::rmsnorm_xbf_q4_ok(2048));
  EXPECT_FALSE(cuda::rmsnorm_xbf_q4_ok(4160)) << "past the register row";
  EXPECT_FALSE(cuda::rmsnorm_xbf_q4_ok(96)) << "not whole groups of 64";
  EXPECT_TRUE(cuda::gated_norm_xbf_q4_ok(32, 128));
  EXPECT_FALSE(cuda::gated_norm_xbf_q4_ok(32, 96)) << "heads not whole groups of 64";
  EXPECT_FALSE(cuda::gated_norm_xbf_q4_ok(4, 320)) << "heads past 256";
  auto gpu = test::make_gpu();
  cuda::Ctx c;
  c.stream = gpu->stream();
  Tensor buf = gpu->alloc(DType::U8, {int64_t(cuda::xbf_bytes(4, 128))});
  Tensor f = gpu->alloc(DType::F32, {4, 128});
  const cuda::X16 rows = cuda::xbf_carve(buf.data, 4, 128, true);
  float* p = f.ptr<float>();
  EXPECT_THROW(cuda::rmsnorm_xbf_q4(c, p, p, p, p, 1e-6f, nullptr, 4, 128, rows), std::exception) << "x and resid";
  EXPECT_THROW(cuda::rmsnorm_xbf_q4(c, p + 1, nullptr, nullptr, p, 1e-6f, nullptr, 4, 128, rows), std::exception)
      << "unaligned";
  const cuda::X16 plain = cuda::xbf_carve(buf.data, 4, 128, false);
  EXPECT_THROW(cuda::rmsnorm_xbf_q4(c, p, nullptr, nullptr, p, 1e-6f, nullptr, 4, 128, plain), std::exception)
      << "rows not carved for the exact-code loop";
  EXPECT_THROW(cuda::rmsnorm_xbf_q4(c, p, nullptr, nullptr, p, 1e-6f, nullptr, 4, 128, rows, &rows), std::exception)
      << "plain rows carved for the exact-code loop";
  EXPECT_THROW(cuda::gated_norm_xbf_q4(c, p, p, p, 1e-6f, 2, 64, 4, plain), std::exception)
      << "gated: rows not carved for the exact-code loop";
  EXPECT_THROW(cuda::gated_norm_xbf_q4(c, p, p, p, 1e-6f, 4, 64, 4, rows), std::exception)
      << "gated: rows carved for another width";
  EXPECT_THROW(cuda::gated_norm_xbf_q4(c, p, p, p, 1e-6f, 1, 96, 4, rows), std::exception)
      << "gated: head width not whole groups";
}

}  // namespace
}  // namespace fern
