// Linear (dense bf16, affine 4/8-bit), embedding and argmax of the CPU backend against double-precision
// references on seeded random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_ops.h"
#include "cpu/random_model.h"
#include "cpu/reference.h"
#include "test_util.h"

namespace fern {
namespace {

std::vector<float> ref_linear(const std::vector<float>& x, int64_t T, const LinearWeight& w) {
  return test::to_float(test::ref_linear(test::to_double(x), T, w));
}
using test::ref_weight;

struct Shape {
  int64_t out, in;
};

TEST(CpuLinear, MatchesDoubleReference) {
  // Awkward and real widths (multiples of the group size, as the format requires), odd row counts.
  const Shape shapes[] = {{1, 64}, {37, 128}, {130, 448}, {256, 2048}, {9, 4096}};
  int negative_scales = 0;
  double worst = 0;
  for (int bits : {16, 4, 8})
    for (const Shape& sh : shapes)
      for (int64_t T : {1, 7, 33}) {
        test::OwnedStorage st;
        const uint64_t seed = uint64_t(bits * 1000 + sh.out * 7 + sh.in + T);
        auto vals = test::randn(size_t(sh.out * sh.in), seed, 0.05f);
        LinearWeight w = test::make_linear(st, "test.w", vals, 0, sh.out, sh.in, bits);
        if (bits != 16)
          for (int64_t i = 0; i < w.scales.numel(); ++i) negative_scales += w.scales.ptr<uint16_t>()[i] >> 15;
        auto x = test::randn(size_t(T * sh.in), seed + 1);
        std::vector<float> got(T * sh.out);
        cpu::linear(got.data(), x.data(), T, w, 2);
        auto ref = ref_linear(x, T, w);
        const double e = test::nmse(got.data(), ref.data(), ref.size());
        // fp32 dot products of up to 4096 terms against double: measured worst NMSE 4.4e-13 over all cases.
        // 1e-11 is far below any real defect (a wrong nibble order or group index gives NMSE > 1e-3).
        EXPECT_LT(e, 1e-11) << "bits " << bits << " [" << sh.out << ", " << sh.in << "] T " << T;
        worst = std::max(worst, e);
      }
  std::printf("linear vs double reference: worst NMSE %.3g\n", worst);
  // The quantizer makes a negative scale whenever a group's maximum dominates: about half of them.
  EXPECT_GT(negative_scales, 100);
}

TEST(CpuLinear, OtherGroupSizes) {
  // The MLX format allows other group sizes: 32 and 128 (lane counts 4..32), and 96, whose 12 or 24 lanes are not a
  // power of two (the lanes' final sum halves an odd count). Input-row counts 1..6 take every tail of the
  // four-row blocks.
  double worst = 0;
  for (int group : {32, 96, 128})
    for (int bits : {4, 8})
      for (int64_t T : {1, 2, 3, 5, 6}) {
        test::OwnedStorage st;
        const int64_t N = 19, K = group == 96 ? 576 : 768;
        const uint64_t seed = uint64_t(group * 100 + bits * 10 + T);
        LinearWeight w = test::make_linear(st, "test.w", test::randn(size_t(N * K), seed, 0.05f), 0, N, K, bits, group);
        auto x = test::randn(size_t(T * K), seed + 1);
        std::vector<float> got(T * N);
        cpu::linear(got.data(), x.data(), T, w, 2);
        auto ref = ref_linear(x, T, w);
        const double e = test::nmse(got.data(), ref.data(), ref.size());
        // As MatchesDoubleReference: fp32 sums of K <= 768 terms, ~1e-13; a lane or group mix-up gives > 1e-3.
        EXPECT_LT(e, 1e-11) << "group " << group << " bits " << bits << " T " << T;
        worst = std::max(worst, e);
      }
  std::printf("other group sizes vs double reference: worst NMSE %.3g\n", worst);
}

TEST(CpuLinear, ManyProductsInOneRegionEqualSeparateCalls) {
  // linear_many (a layer's projections, a batch of experts) gives each output exactly what linear() gives it,
  // whatever the jobs beside it: affine 4- and 8-bit and dense weights of different shapes, row counts and inputs.
  // Jobs 5-7 take job 0's input: 5 in its layout (it reads job 0's permutation), 6 at 8 bits and 7 in groups of
  // 128 (each its own).
  test::OwnedStorage st;
  const struct {
    int64_t out, in, T;
    int bits, group;
    int input_of;  // the job whose input rows this one takes (itself: its own)
  } specs[] = {{300, 512, 1, 4, 64, 0}, {40, 2048, 3, 8, 64, 1}, {7, 128, 9, 16, 64, 2}, {513, 256, 1, 4, 64, 3},
               {64, 64, 0, 4, 64, 4},   {77, 512, 1, 4, 64, 0},  {33, 512, 1, 8, 64, 0}, {21, 512, 1, 4, 128, 0}};
  std::vector<LinearWeight> ws;
  std::vector<std::vector<float>> xs, many, one;
  for (size_t i = 0; i < std::size(specs); ++i) {
    const auto& sp = specs[i];
    ws.push_back(test::make_linear(st, "w" + std::to_string(i), test::randn(size_t(sp.out * sp.in), 20 + i, 0.05f), 0,
                                   sp.out, sp.in, sp.bits, sp.group));
    xs.push_back(size_t(sp.input_of) == i ? test::randn(size_t(std::max<int64_t>(sp.T, 1) * sp.in), 40 + i)
                                          : xs[size_t(sp.input_of)]);
    many.emplace_back(size_t(sp.T * sp.out), -1.0f);
    one.emplace_back(size_t(sp.T * sp.out), -2.0f);
  }
  for (int threads : {1, 2}) {
    std::vector<cpu::LinearJob> jobs;
    for (size_t i = 0; i < ws.size(); ++i)
      jobs.push_back({many[i].data(), xs[size_t(specs[i].input_of)].data(), specs[i].T, &ws[i]});
    cpu::linear_many(jobs, threads);
    for (size_t i = 0; i < ws.size(); ++i) {
      cpu::linear(one[i].data(), xs[i].data(), specs[i].T, ws[i], threads);
      EXPECT_EQ(many[i], one[i]) << "job " << i << ", " << threads << " threads";
    }
  }
  // A job with rows must have been written (the row-less one leaves nothing to compare).
  EXPECT_NE(many[0][0], -1.0f);
}

TEST(CpuLinear, RowsAreIndependentOfBatchAndThreads) {
  test::OwnedStorage st;
  const int64_t N = 300, K = 512, T = 9;
  LinearWeight w = test::make_linear(st, "w", test::randn(N * K, 3, 0.05f), 0, N, K, 4);
  auto x = test::randn(T * K, 4);
  std::vector<float> all(T * N), one(N), serial(T * N);
  cpu::linear(all.data(), x.data(), T, w, 2);
  cpu::linear(serial.data(), x.data(), T, w, 1);
  EXPECT_EQ(all, serial);
  for (int64_t t = 0; t < T; ++t) {
    cpu::linear(one.data(), x.data() + t * K, 1, w, 2);
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(one[n], all[t * N + n]) << t << " " << n;
  }
}

TEST(CpuLinear, StridedExpertStack) {
  // The HF layout binds gate and up as two strided views of one fused [E, 2I, H] stack.
  test::OwnedStorage st;
  const int64_t E = 3, I = 40, H = 128;
  auto vals = test::randn(size_t(E * 2 * I * H), 5, 0.1f);
  LinearWeight fused = test::make_linear(st, "gate_up", vals, E, 2 * I, H, 16);
  LinearWeight gate = fused, up = fused;
  gate.name = "gate";
  gate.out = I;
  gate.expert_stride = 2 * I * H;
  gate.w = Tensor(fused.w.data, DType::BF16, {E, I, H});
  up = gate;
  up.name = "up";
  up.w.data = fused.w.ptr<uint16_t>() + I * H;
  auto x = test::randn(size_t(5 * H), 6);
  for (int64_t e = 0; e < E; ++e)
    for (const LinearWeight* s : {&gate, &up}) {
      LinearWeight m = s->expert(e);
      std::vector<float> got(5 * I);
      cpu::linear(got.data(), x.data(), 5, m, 2);
      auto ref = ref_linear(x, 5, m);
      // Check against the fused matrix's rows directly too, so a wrong stride cannot hide in ref_linear.
      const int64_t row0 = (s == &up ? I : 0);
      EXPECT_EQ(bf16_to_f32(m.w.ptr<uint16_t>()[7 * H + 3]), round_bf16(vals[(e * 2 * I + row0 + 7) * H + 3]));
      EXPECT_LT(test::nmse(got.data(), ref.data(), ref.size()), 1e-11);
    }
}

TEST(CpuLinear, BadWeightsGiveClearErrors) {
  test::OwnedStorage st;
  LinearWeight good = test::make_linear(st, "layers.0.q_proj", test::randn(64 * 128, 7), 0, 64, 128, 4);
  auto expect_error = [](const LinearWeight& w, const char* needle) {
    try {
      cpu::validate_linear(w);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layers.0.q_proj"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EXPECT_NO_THROW(cpu::validate_linear(good));
  LinearWeight w = good;
  w.kind = LinearWeight::Kind::None;
  expect_error(w, "missing");
  w = good;
  w.bits = 3;
  expect_error(w, "bits");
  w = good;
  w.scales = w.scales.reshape({128, 1});
  expect_error(w, "scales");
  w = good;
  w.group_size = 48;
  expect_error(w, "group size");
  w = good;
  w.in = 256;
  expect_error(w, "packed");
  w = good;
  w.kind = LinearWeight::Kind::Dense;
  expect_error(w, "dtype");
}

TEST(CpuEmbed, RowsAndBadIds) {
  for (int bits : {16, 4}) {
    test::OwnedStorage st;
    LinearWeight table = test::make_linear(st, "embed_tokens", test::randn(100 * 192, 8), 0, 100, 192, bits);
    std::vector<int32_t> ids = {5, 99, 0, 5};
    std::vector<float> out(ids.size() * 192);
    cpu::embed(out.data(), ids.data(), int64_t(ids.size()), table, 2);
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t k = 0; k < 192; ++k)
        worst = std::max(worst, std::fabs(out[t * 192 + k] - ref_weight(table, ids[t], k)));
    // One fp32 multiply-add per element against double: within a few ulps of values of magnitude ~3.
    EXPECT_LT(worst, 1e-5);
    ids[2] = 100;
    try {
      cpu::embed(out.data(), ids.data(), int64_t(ids.size()), table, 2);
      ADD_FAILURE() << "no error for id 100";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("embed_tokens"), std::string::npos) << e.what();
    }
  }
}

TEST(CpuArgmax, TiesAndNaN) {
  const int64_t V = 1000;
  auto l = test::randn(3 * V, 9);
  l[17] = 50.0f;
  l[400] = 50.0f;  // tie: lowest index wins
  l[V + 3] = NAN;
  l[V + 900] = 40.0f;
  for (int64_t j = 0; j < V; ++j) l[2 * V + j] = NAN;
  std::vector<int32_t> ids(3);
  cpu::argmax(ids.data(), l.data(), 3, V);
  EXPECT_EQ(ids[0], 17);
  EXPECT_EQ(ids[1], 900);
  EXPECT_EQ(ids[2], 0);
}

TEST(CpuBackend, ArenaKeepsTensorsUntilReset) {
  auto be = make_cpu_backend(2);
  be->begin_forward();
  std::vector<Tensor> ts;
  for (int i = 0; i < 40; ++i) {  // 40 x 1 MiB: more than the first block, so the arena chains blocks
    ts.push_back(be->scratch(DType::F32, {256, 1024}));
    std::fill(ts.back().ptr<float>(), ts.back().ptr<float>() + ts.back().numel(), float(i));
  }
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(ts[i].ptr<float>()[0], float(i));
    EXPECT_EQ(ts[i].ptr<float>()[256 * 1024 - 1], float(i));
    EXPECT_EQ(uintptr_t(ts[i].data) % 64, 0u);
  }
  // After a reset, the same sequence of requests gets the same addresses (the chain merged into one block).
  be->begin_forward();
  std::vector<void*> first;
  for (int i = 0; i < 40; ++i) first.push_back(be->scratch(DType::F32, {256, 1024}).data);
  be->begin_forward();
  for (int i = 0; i < 40; ++i) EXPECT_EQ(be->scratch(DType::F32, {256, 1024}).data, first[i]);
}

TEST(CpuBackend, ScratchScopeFreesWhatItTook) {
  auto be = make_cpu_backend(2);
  be->begin_forward();
  Tensor keep = be->scratch(DType::F32, {1000});  // taken before the scopes: never handed out again
  std::fill(keep.ptr<float>(), keep.ptr<float>() + 1000, 7.0f);
  be->scratch_push();
  void* a = be->scratch(DType::F32, {4096}).data;
  std::fill(static_cast<float*>(a), static_cast<float*>(a) + 4096, -1.0f);
  be->scratch_pop();
  EXPECT_EQ(be->scratch(DType::F32, {4096}).data, a);  // the scope's memory again
  be->scratch_push();
  be->scratch_push();  // nested, and larger than the first block: the arena chains a block
  void* big = be->scratch(DType::F32, {8 << 20}).data;
  be->scratch_pop();
  EXPECT_EQ(be->scratch(DType::F32, {8 << 20}).data, big);
  be->scratch_pop();
  EXPECT_EQ(keep.ptr<float>()[0], 7.0f);
  EXPECT_EQ(keep.ptr<float>()[999], 7.0f);
  EXPECT_THROW(be->scratch_pop(), Error);  // no scope open
}

}  // namespace
}  // namespace fern
