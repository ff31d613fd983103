// CUDA rmsnorm, add_rmsnorm, add, embed (4-bit at the real 248320 x 2048 size, bf16) and argmax (real vocabulary,
// ties, NaN) against the CPU backend; scratch arena addresses are stable across begin_forward().
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "cuda/fast_div.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

// fp32 on both sides, one reduction per row in a different order (expected ~1e-14; these tests passed on the
// H200 with this threshold). 1e-10 catches any wrong element or row.
constexpr double kNmse = 1e-10;

TEST(CudaMisc, Norms) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  for (int64_t D : {2048, 128, 100, 4096, 102, 5000}) {  // 102, 5000: the generic (not float4) kernel
    const int64_t R = 3;
    auto x = test::randn(size_t(R * D), 1 + D), d = test::randn(size_t(R * D), 2 + D),
         w = test::randn(size_t(D), 3 + D, 0.3f);
    std::vector<float> ref(size_t(R * D)), resid = x;
    cpu->rmsnorm(test::host_f32(ref, {R, D}), test::host_f32(x, {R, D}), test::host_f32(w, {D}), 1e-6f);
    Tensor dx = test::upload_f32(*gpu, x, {R, D}), dw = test::upload_f32(*gpu, w, {D}), dout = gpu->alloc(DType::F32, {R, D});
    gpu->rmsnorm(dout, dx, dw, 1e-6f);
    auto got = test::download(*gpu, dout);
    EXPECT_LT(test::nmse(got.data(), ref.data(), got.size()), kNmse) << "rmsnorm D=" << D;

    cpu->add_rmsnorm(test::host_f32(resid, {R, D}), test::host_f32(d, {R, D}), test::host_f32(ref, {R, D}),
                     test::host_f32(w, {D}), 1e-6f);
    Tensor dd = test::upload_f32(*gpu, d, {R, D});
    gpu->add_rmsnorm(dx, dd, dout, dw, 1e-6f);
    got = test::download(*gpu, dout);
    auto gres = test::download(*gpu, dx);
    EXPECT_LT(test::nmse(got.data(), ref.data(), got.size()), kNmse) << "add_rmsnorm D=" << D;
    EXPECT_LT(test::nmse(gres.data(), resid.data(), gres.size()), kNmse) << "add_rmsnorm resid D=" << D;

    gpu->add(dout, dx, dd);
    got = test::download(*gpu, dout);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], resid[i] + d[i]);
  }
}

TEST(CudaMisc, Embed) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  test::OwnedStorage st;
  for (int which = 0; which < 4; ++which) {
    // The real 4-bit table, an 8-bit one with 4-code words, 4-bit with groups of 32 and a row of 5 groups, bf16.
    LinearWeight hw = which == 0   ? test::raw_affine(st, "embed", 0, 248320, 2048, 4, 64, 5)
                      : which == 1 ? test::raw_affine(st, "embed 8-bit", 0, 3001, 320, 8, 64, 8)
                      : which == 2 ? test::raw_affine(st, "embed 4-bit g32", 0, 999, 160, 4, 32, 9)
                                   : test::raw_dense(st, "embed bf16", 0, 1000, 136, 6);
    LinearWeight dw = gpu->to_device(hw);
    std::vector<int32_t> ids = {0, int32_t(hw.out - 1), 12345 % int32_t(hw.out), 7};
    const int64_t T = int64_t(ids.size()), H = hw.in;
    std::vector<float> ref(size_t(T * H));
    cpu->embed(test::host_f32(ref, {T, H}), Tensor(ids.data(), DType::I32, {T}), hw);
    Tensor did = gpu->alloc(DType::I32, {T});
    gpu->copy(did, Tensor(ids.data(), DType::I32, {T}));
    Tensor dout = gpu->alloc(DType::F32, {T, H});
    gpu->embed(dout, did, dw);
    auto got = test::download(*gpu, dout);
    EXPECT_EQ(test::max_abs_diff(got.data(), ref.data(), got.size()), 0.0) << hw.name;  // same fp32 math: exact
  }
}

TEST(CudaMisc, Argmax) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  const int64_t V = 248320, T = 4;
  auto l = test::randn(size_t(T * V), 77);
  // Row 0: a tie between two far-apart maxima (the lower index wins). Row 1: NaNs everywhere but one value.
  // Row 2: maximum at the last index. Row 3: plain random.
  l[1000] = l[200000] = 50.0f;
  for (int64_t j = 0; j < V; ++j) l[V + j] = j == 4242 ? 1.0f : std::nanf("");
  l[2 * V + V - 1] = 60.0f;
  std::vector<int32_t> want(T);
  want[0] = 1000;
  want[1] = 4242;
  want[2] = int32_t(V - 1);
  want[3] = int32_t(std::max_element(l.begin() + 3 * V, l.end()) - (l.begin() + 3 * V));
  gpu->begin_forward();
  Tensor dl = test::upload_f32(*gpu, l, {T, V});
  Tensor did = gpu->alloc(DType::I32, {T});
  for (int rep = 0; rep < 3; ++rep) {  // the per-row counters must reset themselves
    gpu->argmax(did, dl);
    std::vector<int32_t> got(T);
    gpu->copy(Tensor(got.data(), DType::I32, {T}), did);
    EXPECT_EQ(got, want) << "repetition " << rep;
  }
  // An odd vocabulary (rows not a multiple of the blocks' share or of the load batch): maxima at the first and the
  // last index, and a random row.
  const int64_t V2 = 33797, T2 = 3;
  auto l2 = test::randn(size_t(T2 * V2), 78);
  l2[0] = 40.0f;
  l2[V2 + V2 - 1] = 40.0f;
  const std::vector<int32_t> want2 = {
      0, int32_t(V2 - 1), int32_t(std::max_element(l2.begin() + 2 * V2, l2.end()) - (l2.begin() + 2 * V2))};
  Tensor dl2 = test::upload_f32(*gpu, l2, {T2, V2});
  Tensor did2 = gpu->alloc(DType::I32, {T2});
  gpu->argmax(did2, dl2);
  std::vector<int32_t> got2(T2);
  gpu->copy(Tensor(got2.data(), DType::I32, {T2}), did2);
  EXPECT_EQ(got2, want2);
}

TEST(CudaMisc, ScratchAddressesAreStable) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  std::vector<void*> first;
  for (int round = 0; round < 2; ++round) {
    gpu->begin_forward();
    std::vector<void*> got;
    for (int64_t n : {100, 70000000, 5, 300000000, 8})
      got.push_back(gpu->scratch(DType::F32, {n}).data);
    if (round == 0) first = got;
    else EXPECT_EQ(got, first);
  }
}

// cuda::FastDiv (fast_div.h) on the host (the same code runs on the device): every divisor 1..4,096 and a spread of
// larger ones up to 2^31 - 1 (powers of two, their neighbours, primes, random), each against `/` and `%` on
// dividends 0..2,049, around every multiple of d below 40,000, near 2^31 and at random. An off-by-one multiplier
// shows up at the multiples and at the top of the range; a divisor out of range leaves it invalid.
TEST(CudaFastDiv, MatchesDivisionOnTheWholeRange) {
  std::mt19937 rng(7);
  std::vector<int64_t> ds;
  for (int64_t d = 1; d <= 4096; ++d) ds.push_back(d);
  for (int b = 12; b < 31; ++b)
    for (int64_t o : {-1, 0, 1}) ds.push_back((int64_t(1) << b) + o);
  for (int64_t d : {65521, 1000003, 2147483629, 2147483647}) ds.push_back(d);
  for (int i = 0; i < 200; ++i) ds.push_back(1 + int64_t(rng() % 2147483646u));
  int64_t checked = 0;
  for (int64_t d : ds) {
    const cuda::FastDiv fd(d);
    auto check = [&](int64_t n) {
      if (n < 0 || n > INT32_MAX) return;
      ASSERT_EQ(fd.div(int(n)), n / d) << "n " << n << " d " << d;
      ASSERT_EQ(fd.mod(int(n)), n % d) << "n " << n << " d " << d;
      ++checked;
    };
    for (int64_t n = 0; n < 2050; ++n) check(n);
    for (int64_t q = d; q < 40000; q += d)
      for (int64_t o : {-1, 0, 1}) check(q + o);
    for (int64_t n = INT32_MAX - 2100; n <= INT32_MAX; ++n) check(n);
    const int64_t top = INT32_MAX / d * d;  // the last multiple of d
    for (int64_t o : {-1, 0, 1}) check(top + o);
    for (int i = 0; i < 300; ++i) check(int64_t(rng() & 0x7fffffffu));
  }
  EXPECT_GT(checked, int64_t(10'000'000));
  EXPECT_TRUE(cuda::FastDiv(2147483647).ok());
  EXPECT_FALSE(cuda::FastDiv(0).ok());
  EXPECT_FALSE(cuda::FastDiv(int64_t(1) << 31).ok());
}

}  // namespace
}  // namespace fern
