// CUDA linear_multi (several matrices of one input in one launch over their concatenated rows) against the CPU
// backend's linear(), output by output: the GDN input projections and attention q/k/v at their real shapes, and
// awkward tables (single-row matrices, odd rows, narrow rows, group 32, 8-bit, bf16, several token rows, a mix
// of formats that must fall back to separate launches).
#include <gtest/gtest.h>

#include <string>

#include "cuda/gemm_wg.h"
#include "cuda/kernels.h"
#include "cuda/qweight.h"
#include "cuda/weight_group.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

struct Mat {
  int64_t out;
  int bits;  // 4, 8 (affine) or 16 (bf16)
};

// The same kernel loop as linear() (only the matrix pointers are chosen per row), so the same bound as its test.
// The error of each matrix's output is normalised by the mean square of the whole table's reference outputs, not
// by that matrix's own: a one-row matrix has a single output, and a single dot product can be small by
// cancellation while its rounding error is set by the size of its terms. Measured on the H200 (run 3 of
// docs/notes/cuda-decode-v3.md, with the per-matrix normalisation): NMSE 1.9e-12..6.4e-12 (4-bit), 6e-14..1.2e-13
// (8-bit, bf16), except the one-row table, whose 4th output is 0.60 against outputs of ~6.5-7.7 in the others:
// 1.1e-9 normalised by itself, 1.5e-11 by the table's mean square (computed from that run's errors and the CPU
// reference values; the table-normalised test itself has not been run on the GPU). 1e-9 still catches a wrong
// matrix, row offset or output slice (NMSE ~1: independent random weights); an unwritten output is NaN.
constexpr double kNmse = 1e-9;

void expect_table(Backend& cpu, CudaBackend& gpu, const char* name, const std::vector<Mat>& mats,
                  const std::vector<LinearWeight>& hw, std::vector<float> x, const std::vector<Tensor>& outs,
                  int64_t in, int T);

// The host weights of a table (affine, or bf16 for 16 bits), matrix i seeded with base + per_mat i + its rows +
// per_in times the width.
struct TableSeed {
  uint64_t base, per_mat, per_in;
};
std::vector<LinearWeight> host_table(test::OwnedStorage& st, const char* name, const std::vector<Mat>& mats,
                                     int64_t in, int gs, TableSeed sd) {
  std::vector<LinearWeight> hw;
  for (size_t i = 0; i < mats.size(); ++i) {
    const Mat& m = mats[i];
    const uint64_t seed = sd.base + sd.per_mat * i + uint64_t(m.out) + uint64_t(in) * sd.per_in;
    const std::string wn = std::string(name) + "." + std::to_string(i);
    hw.push_back(m.bits == 16 ? test::raw_dense(st, wn.c_str(), 0, m.out, in, seed)
                              : test::raw_affine(st, wn.c_str(), 0, m.out, in, m.bits, gs, seed));
  }
  return hw;
}

// A table set up on the GPU: its host weights (host_table, seeds sd) and their device copies, a random input x
// [T, in] (seed x_seed) on both sides, NaN-filled outputs (an unwritten one stays NaN), and each device matrix and
// output in the kernels' form (q, ys).
struct GpuTable {
  std::unique_ptr<CudaBackend> gpu = test::make_gpu();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  test::OwnedStorage st;
  std::vector<LinearWeight> hw, dw;
  std::vector<float> x;
  Tensor dx;
  std::vector<Tensor> outs;
  std::vector<const LinearWeight*> ws;
  std::vector<cuda::QW> q;
  std::vector<float*> ys;

  GpuTable(const char* name, const std::vector<Mat>& mats, int64_t in, int gs, int T, TableSeed sd, uint64_t x_seed)
      : hw(host_table(st, name, mats, in, gs, sd)), x(test::randn(size_t(T * in), x_seed)) {
    for (const LinearWeight& w : hw) dw.push_back(gpu->to_device(w));
    dx = test::upload_f32(*gpu, x, {T, in});
    for (size_t i = 0; i < mats.size(); ++i) {
      outs.push_back(test::nan_filled(*gpu, T, mats[i].out));
      ws.push_back(&dw[i]);
      q.push_back(cuda::make_qw(dw[i]));
      ys.push_back(outs[i].ptr<float>());
    }
  }
  // Moves the device matrices into one region (weight_group.h), as upload() and the random device model lay out a
  // layer's input projections.
  void group() {
    test::group_on_device(*gpu, dw);
    for (size_t i = 0; i < dw.size(); ++i) {
      ws[i] = &dw[i];
      q[i] = cuda::make_qw(dw[i]);
    }
  }
  // A launch context on the backend's stream.
  cuda::Ctx ctx() const {
    cuda::Ctx c;
    c.stream = gpu->stream();
    c.sms = gpu->sm_count();
    c.pdl = gpu->pdl();
    return c;
  }
};

// norm: the table's input is rmsnorm(x) * w computed by the kernel (linear_multi_norm, the layer's input norm
// folded into the projections), called directly (via_backend false) or through CudaBackend::rmsnorm_linear_multi.
struct NormMode {
  bool on = false;
  bool via_backend = false;
};

void run_table(const char* name, const std::vector<Mat>& mats, int64_t in, int gs, int T, NormMode nm = {}) {
  SCOPED_TRACE(name);
  GpuTable tb(name, mats, in, gs, T, {1000, 17, 3}, 77 + uint64_t(in));
  auto& [gpu, cpu, st, hw, dw, x, dx, outs, ws, q, ys] = tb;
  // Norm weights around 1 (as trained RMSNorm weights are), so that the normed row is not x itself.
  auto nw = test::randn(size_t(in), 55 + uint64_t(in), 0.3f);
  for (float& v : nw) v += 1.0f;
  const float eps = 1e-6f;
  std::vector<float> xn_ref(size_t(T * in));
  Tensor dxn;
  if (!nm.on) {
    gpu->linear_multi(outs, dx, ws);
  } else {
    cpu->rmsnorm(test::host_f32(xn_ref, {T, in}), test::host_f32(x, {T, in}), test::host_f32(nw, {in}), eps);
    x = xn_ref;  // the CPU reference projects the normed rows
    Tensor dnw = test::upload_f32(*gpu, nw, {in});
    dxn = gpu->alloc(DType::F32, {T, in});
    if (nm.via_backend) {
      gpu->rmsnorm_linear_multi(outs, dx, dnw, eps, dxn, ws);
    } else {
      cuda::linear_multi_norm(tb.ctx(), q.data(), dx.ptr<float>(), dnw.ptr<float>(), eps, dxn.ptr<float>(), ys.data(),
                              static_cast<int>(q.size()), T);
    }
    const auto got_xn = test::download(*gpu, dxn);
    const double e = test::nmse(got_xn.data(), xn_ref.data(), got_xn.size());
    std::printf("linear_multi %-22s normed input NMSE %.3e\n", name, e);
    // The same formula with the sum of squares in another order: ~1e-14 expected; a wrong weight, eps or row gives
    // > 1e-6.
    EXPECT_LT(e, 1e-10);
  }
  expect_table(*cpu, *gpu, name, mats, hw, x, outs, in, T);
}

// Each output of a table against the CPU's linear() of x, normalised by the whole table's mean square (kNmse says
// why).
void expect_table(Backend& cpu, CudaBackend& gpu, const char* name, const std::vector<Mat>& mats,
                  const std::vector<LinearWeight>& hw, std::vector<float> x, const std::vector<Tensor>& outs,
                  int64_t in, int T) {
  std::vector<std::vector<float>> refs;
  double table_sq = 0.0;
  size_t table_n = 0;
  for (size_t i = 0; i < mats.size(); ++i) {
    refs.emplace_back(size_t(T * mats[i].out), 0.0f);
    cpu.linear(test::host_f32(refs[i], {T, mats[i].out}), test::host_f32(x, {T, in}), hw[i]);
    for (float r : refs[i]) table_sq += double(r) * r;
    table_n += refs[i].size();
  }
  const double table_ms = table_sq / double(table_n);
  for (size_t i = 0; i < mats.size(); ++i) {
    auto got = test::download(gpu, outs[i]);
    double err = 0.0;
    for (size_t j = 0; j < got.size(); ++j) err += (double(got[j]) - refs[i][j]) * (double(got[j]) - refs[i][j]);
    const double e = err / (double(got.size()) * table_ms);
    std::printf("linear_multi %-22s matrix %zu [%6ld x %5ld] %2d-bit T=%d  NMSE %.3e (own outputs %.3e)\n", name,
                i, long(mats[i].out), long(in), mats[i].bits, T, e,
                test::nmse(got.data(), refs[i].data(), got.size()));
    EXPECT_LT(e, kNmse) << "matrix " << i;  // NaN (an unwritten output) fails too
  }
}

TEST(CudaLinearMulti, RealShapes) {
  FERN_REQUIRE_GPU();
  run_table("gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1);
  run_table("attn q|k|v", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 64, 1);
  run_table("gdn prefill T=5", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 5);
}

TEST(CudaLinearMulti, AwkwardTables) {
  FERN_REQUIRE_GPU();
  run_table("one row each", {{1, 4}, {1, 4}, {1, 4}, {1, 4}}, 2048, 64, 1);
  run_table("odd rows narrow", {{37, 4}, {1, 4}, {45, 4}}, 192, 64, 2);
  run_table("group 32", {{77, 4}, {3, 4}}, 96, 32, 3);
  run_table("8-bit", {{300, 8}, {19, 8}, {256, 8}, {1, 8}}, 4096, 32, 1);
  run_table("bf16", {{515, 16}, {33, 16}}, 2048, 0, 2);
  run_table("single matrix", {{129, 4}}, 640, 128, 2);
  run_table("mixed formats", {{64, 4}, {64, 8}, {31, 4}}, 2048, 64, 1);  // falls back to separate launches
}

// The input norm folded into the projections (decode: one row; the kernel also takes several rows).
TEST(CudaLinearMulti, WithInputNorm) {
  FERN_REQUIRE_GPU();
  run_table("norm gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1, {true, false});
  run_table("norm attn q|k|v backend", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 64, 1, {true, true});
  run_table("norm odd rows T=3", {{37, 4}, {1, 4}, {45, 4}}, 192, 64, 3, {true, false});
  run_table("norm 8-bit", {{300, 8}, {19, 8}}, 4096, 32, 1, {true, false});
  run_table("norm bf16", {{515, 16}, {33, 16}}, 2048, 0, 1, {true, false});
  run_table("norm mixed backend", {{64, 4}, {64, 8}, {31, 4}}, 2048, 64, 1, {true, true});  // rmsnorm + fall-back
  {
    // The norm as its own launch, then the projections (FERN_CUDA_NORM_FOLD=0, a comparison switch).
    test::EnvGuard unfold("FERN_CUDA_NORM_FOLD", "0");
    run_table("norm gdn unfolded backend", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1, {true, true});
  }
  {
    // One matrix through the backend (the final norm and lm_head) in each form of FERN_CUDA_HEAD_NORM, on the
    // tensor-core GEMV (FERN_CUDA_GEMV_TC=1, whole tiles per warp at this row count).
    test::EnvGuard tc("FERN_CUDA_GEMV_TC", "1");
    for (const char* form : {"launch", "multi", "fold", "fold-multi"}) {
      test::EnvGuard hf("FERN_CUDA_HEAD_NORM", form);
      run_table((std::string("norm head ") + form).c_str(), {{40001, 4}}, 2048, 64, 1, {true, true});
    }
    test::EnvGuard hf("FERN_CUDA_HEAD_NORM", "fused");
    EXPECT_THROW(run_table("norm head refused", {{64, 4}}, 2048, 64, 1, {true, true}), std::exception);
  }
  test::EnvGuard bad("FERN_CUDA_NORM_FOLD", "2");
  EXPECT_THROW(run_table("norm fold refused", {{64, 4}}, 2048, 64, 1, {true, true}), std::exception);
}

// A table in one region (GpuTable::group): the three-blocks-per-SM GEMV reads it as one matrix
// (FERN_CUDA_GEMV_CONTIG=1, the default) or matrix by matrix (=0), plain, with the norm and through the backend. Both
// against the CPU (kNmse) and bit for bit against each other: the same loads and arithmetic in the same order, only
// the addresses computed another way. Tables whose matrices are allocated one by one are not contiguous.
void run_grouped(const char* name, const std::vector<Mat>& mats, int T, NormMode nm) {
  SCOPED_TRACE(name);
  constexpr int64_t in = 2048;  // the packed-scale kernel's widths: multiples of 2,048
  GpuTable tb(name, mats, in, 64, T, {5000, 11, 7}, 123);
  auto& [gpu, cpu, st, hw, dw, x, dx, outs, ws, q, ys] = tb;
  tb.group();
  ASSERT_TRUE(cuda::linear_multi_contiguous(q.data(), static_cast<int>(q.size())));
  auto nw = test::randn(size_t(in), 56, 0.3f);
  for (float& v : nw) v += 1.0f;
  const float eps = 1e-6f;
  if (nm.on) {
    std::vector<float> xn_ref(size_t(T * in));
    cpu->rmsnorm(test::host_f32(xn_ref, {T, in}), test::host_f32(x, {T, in}), test::host_f32(nw, {in}), eps);
    x = xn_ref;  // the CPU reference projects the normed rows
  }
  Tensor dnw = test::upload_f32(*gpu, nw, {in});
  Tensor dxn = gpu->alloc(DType::F32, {T, in});
  std::vector<std::vector<float>> got[2];
  for (int contig = 1; contig >= 0; --contig) {
    test::EnvGuard sw("FERN_CUDA_GEMV_CONTIG", contig ? "1" : "0");
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i] = test::nan_filled(*gpu, T, mats[i].out);
      ys[i] = outs[i].ptr<float>();
    }
    if (!nm.on)
      gpu->linear_multi(outs, dx, ws);
    else if (nm.via_backend)
      gpu->rmsnorm_linear_multi(outs, dx, dnw, eps, dxn, ws);
    else
      cuda::linear_multi_norm(tb.ctx(), q.data(), dx.ptr<float>(), dnw.ptr<float>(), eps, dxn.ptr<float>(), ys.data(),
                              static_cast<int>(q.size()), T);
    expect_table(*cpu, *gpu, contig ? "one matrix" : "matrix by matrix", mats, hw, x, outs, in, T);
    for (const Tensor& o : outs) got[contig].push_back(test::download(*gpu, o));
  }
  for (size_t i = 0; i < outs.size(); ++i)
    EXPECT_TRUE(test::same_bits(got[0][i], got[1][i])) << "matrix " << i;
}

TEST(CudaLinearMulti, ContiguousTable) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  test::EnvGuard fp32("FERN_CUDA_GEMV_Q8", "0");  // the digit form is the one-region kernel's only (DigitsWithInputNorm)
  run_grouped("grouped gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 1, {});
  run_grouped("grouped norm gdn", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 1, {true, false});
  run_grouped("grouped norm attn backend", {{8192, 4}, {512, 4}, {512, 4}}, 1, {true, true});
  run_grouped("grouped norm attn T=2", {{8192, 4}, {512, 4}, {512, 4}}, 2, {true, false});
  run_grouped("grouped odd rows", {{4999, 4}, {1, 4}, {77, 4}}, 1, {true, false});
  run_grouped("grouped one matrix", {{6001, 4}}, 1, {true, false});
  // The check itself on descriptors only (no memory is touched): rows of 1,024 code bytes and 32 groups.
  cuda::QW a;
  a.bits = 4;
  a.in = 2048;
  a.gs = 64;
  a.out = 100;
  cuda::QW b = a;
  b.out = 7;
  static char codes[128 * 1024];
  static uint16_t sc[128 * 32], bi[128 * 32];
  a.w = codes;
  a.s = sc;
  a.b = bi;
  b.w = codes + 100 * 1024;
  b.s = sc + 100 * 32;
  b.b = bi + 100 * 32;
  const cuda::QW joined[2] = {a, b};
  EXPECT_TRUE(cuda::linear_multi_contiguous(joined, 2));
  for (int part = 0; part < 3; ++part) {
    cuda::QW c = b;
    if (part == 0) c.w = codes + 101 * 1024;  // one row of codes between them
    if (part == 1) c.s = sc + 100 * 32 + 2;
    if (part == 2) c.b = bi + 99 * 32;
    const cuda::QW apart[2] = {a, c};
    EXPECT_FALSE(cuda::linear_multi_contiguous(apart, 2)) << "part " << part;
  }
  test::EnvGuard bad("FERN_CUDA_GEMV_CONTIG", "2");
  EXPECT_THROW(run_table("contig refused", {{8192, 4}, {4096, 4}}, 2048, 64, 1, {true, false}), std::exception);
}

// A table's input norm: weights around 1 (as trained RMSNorm weights are; seed), the CPU's normed rows of x, and the
// device copies (weights; room for the normed rows).
struct NormSetup {
  std::vector<float> nw, xn_ref;
  Tensor dnw, dxn;
  float eps = 1e-6f;
};
NormSetup norm_setup(GpuTable& tb, int64_t in, int T, uint64_t seed) {
  NormSetup n;
  n.nw = test::randn(size_t(in), seed, 0.3f);
  for (float& v : n.nw) v += 1.0f;
  n.xn_ref.resize(size_t(T * in));
  tb.cpu->rmsnorm(test::host_f32(n.xn_ref, {T, in}), test::host_f32(tb.x, {T, in}), test::host_f32(n.nw, {in}), n.eps);
  n.dnw = test::upload_f32(*tb.gpu, n.nw, {in});
  n.dxn = tb.gpu->alloc(DType::F32, {T, in});
  return n;
}

// The input projections' GEMV against the normed row as three 8-bit digits per value (FERN_CUDA_GEMV_Q8=1; qdot.cuh
// chunk_dot_q8: the digits' error is below 2^-17 of the row's scale max |x| / 127, an NMSE ~1e-13 expected against
// kNmse's 1e-9; a wrong digit, layout or scale gives > 1e-3) on the real tables in one region, through the kernel and
// through the backend, several token rows (each its own scale), and a row with one value 300x the others. Against the
// CPU, and against the fp32 form (FERN_CUDA_GEMV_Q8=0): different bits (the digit form ran), the same normed rows.
void run_digits(const char* name, const std::vector<Mat>& mats, int T, bool via_backend, float outlier) {
  SCOPED_TRACE(name);
  constexpr int64_t in = 2048;
  GpuTable tb(name, mats, in, 64, T, {7000, 13, 5}, 321);
  auto& [gpu, cpu, st, hw, dw, x, dx, outs, ws, q, ys] = tb;
  tb.group();
  ASSERT_TRUE(cuda::linear_multi_contiguous(q.data(), static_cast<int>(q.size())));
  x[5] *= outlier;
  dx = test::upload_f32(*gpu, x, {T, in});
  auto [nw, xn_ref, dnw, dxn, eps] = norm_setup(tb, in, T, 57);
  std::vector<std::vector<float>> got[2];
  std::vector<float> xn[2];
  for (int q8 = 0; q8 < 2; ++q8) {
    test::EnvGuard sw("FERN_CUDA_GEMV_Q8", q8 ? "1" : "0");
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i] = test::nan_filled(*gpu, T, mats[i].out);
      ys[i] = outs[i].ptr<float>();
    }
    if (via_backend)
      gpu->rmsnorm_linear_multi(outs, dx, dnw, eps, dxn, ws);
    else
      cuda::linear_multi_norm(tb.ctx(), q.data(), dx.ptr<float>(), dnw.ptr<float>(), eps, dxn.ptr<float>(), ys.data(),
                              static_cast<int>(q.size()), T);
    expect_table(*cpu, *gpu, q8 ? "digits" : "fp32", mats, hw, xn_ref, outs, in, T);
    for (const Tensor& o : outs) got[q8].push_back(test::download(*gpu, o));
    xn[q8] = test::download(*gpu, dxn);
  }
  EXPECT_TRUE(test::same_bits(xn[0], xn[1]));
  EXPECT_FALSE(test::same_bits(got[0][0], got[1][0])) << "the digit form did not run";
}

TEST(CudaLinearMulti, DigitsWithInputNorm) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  run_digits("digits gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 1, false, 1.0f);
  run_digits("digits attn backend", {{8192, 4}, {512, 4}, {512, 4}}, 1, true, 1.0f);
  run_digits("digits gdn T=3", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 3, false, 1.0f);
  run_digits("digits gdn outlier", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 1, true, 300.0f);
  test::EnvGuard bad("FERN_CUDA_GEMV_Q8", "2");
  EXPECT_THROW(run_table("digits refused", {{8192, 4}, {4096, 4}}, 2048, 64, 1, {true, false}), std::exception);
}

// The CUDA-core kernel (FERN_CUDA_GEMV_TC=0 forces it; it is also the default below lm_head's size) with its block
// size forced both ways: 512-thread blocks (FERN_CUDA_GEMV_WIDE=1, taken for rows of 32 lanes: 4-bit from
// 2048 inputs, 8-bit from 1024, bf16 from 512; narrower tables keep the 256-thread kernel) and 256-thread blocks
// (=0; the default takes 512 for lm_head-sized GEMVs only), with and without the input norm.
TEST(CudaLinearMulti, WideBlocks) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  test::each_value("FERN_CUDA_GEMV_WIDE", {"1", "0"}, [] {
    run_table("wide gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1);
    run_table("wide one row each", {{1, 4}, {1, 4}, {1, 4}, {1, 4}}, 2048, 64, 1);
    run_table("wide 8-bit T=2", {{300, 8}, {19, 8}, {256, 8}}, 4096, 32, 2);
    run_table("wide bf16", {{515, 16}, {33, 16}}, 2048, 0, 2);
    run_table("wide norm gdn", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1, {true, false});
    run_table("wide norm attn backend", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 64, 1, {true, true});
    run_table("wide norm 8-bit T=3", {{300, 8}, {19, 8}}, 4096, 32, 3, {true, false});
    run_table("wide norm narrow", {{37, 4}, {1, 4}, {45, 4}}, 192, 64, 1, {true, false});  // 256-thread kernel
  });
}

// Three 256-thread blocks per SM (FERN_CUDA_GEMV_OCC=3, the default: registers capped at 80, the norm weight read
// after the PDL wait with the row; 4-bit rows of 32 lanes with more than two blocks' work per SM, the norm up to
// 2,048 inputs) and two (=2): the real tables with and without the norm, one-row matrices, a norm over 4,096 inputs
// and 8-bit rows (both keep the two-block kernel), several tokens.
TEST(CudaLinearMulti, ThreeBlocksPerSm) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  test::each_value("FERN_CUDA_GEMV_OCC", {"3", "2"}, [] {
    run_table("occ gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1);
    run_table("occ one row each", {{1, 4}, {1, 4}, {1, 4}, {1, 4}}, 2048, 64, 1);
    run_table("occ norm gdn", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1, {true, false});
    run_table("occ norm attn backend T=2", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 64, 2, {true, true});
    run_table("occ norm 4096 wide", {{300, 4}, {19, 4}}, 4096, 64, 1, {true, false});
    run_table("occ norm 8-bit", {{300, 8}, {19, 8}}, 4096, 32, 1, {true, false});
  });
}

// The tensor-core kernel (FERN_CUDA_GEMV_TC=1) and its tiles per matrix (each matrix's rows rounded up to 16) with
// two item buffers and three, plain and with the input norm: the real tables, one-row matrices (four tiles of one
// row each), odd rows with K not a multiple of 256, several token rows, groups of 128.
TEST(CudaLinearMulti, TensorCoreLoop) {
  FERN_REQUIRE_GPU();
  test::EnvGuard on("FERN_CUDA_GEMV_TC", "1");
  test::each_value("FERN_CUDA_GEMV_TC_NB", {"2", "3"}, [] {
    run_table("tc gdn qkv|z|b|a", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1);
    run_table("tc one row each", {{1, 4}, {1, 4}, {1, 4}, {1, 4}}, 2048, 64, 1);
    run_table("tc odd rows narrow T=2", {{37, 4}, {1, 4}, {45, 4}}, 192, 64, 2);
    run_table("tc group 128", {{129, 4}, {17, 4}}, 640, 128, 3);
    run_table("tc norm gdn", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 1, {true, false});
    run_table("tc norm attn backend", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 64, 1, {true, true});
    run_table("tc norm odd rows T=3", {{37, 4}, {1, 4}, {45, 4}}, 192, 64, 3, {true, false});
  });
}

// The prefill form (linear_gemm_multi, sm_90a): all the matrices of a table in one launch of the wgmma loop (the
// exact-code loop for 4-bit groups of 64 and 128, the synchronous loop for 8-bit), x converted once, each matrix
// starting on a weight block of its own. Tables with 128-token tiles (>= two waves of blocks) and 64-token ones,
// one-row and odd-row matrices, and through the backend (CudaBackend::linear_multi, which takes it for T > 1 where
// a matrix wins the GEMM). The wgmma loop's precision class (test_cuda_linear_gemm.cpp: 1e-11 .. 2e-10), so kNmse.
void run_gemm_table(const char* name, const std::vector<Mat>& mats, int64_t in, int gs, int T, bool via_backend) {
  SCOPED_TRACE(name);
  GpuTable tb(name, mats, in, gs, T, {3000, 13, 5}, 91 + uint64_t(in) + uint64_t(T));
  auto& [gpu, cpu, st, hw, dw, x, dx, outs, ws, q, ys] = tb;
  if (via_backend) {
    gpu->linear_multi(outs, dx, ws);
  } else {
    const size_t bytes = cuda::xbf_bytes(T, in);
    Tensor buf = gpu->alloc(DType::F32, {int64_t((bytes + 3) / 4)});
    cuda::Ctx ctx = tb.ctx();
    ctx.gemm_wg = true;
    ctx.gemm_ws = buf.data;
    ctx.gemm_ws_bytes = bytes;
    ASSERT_TRUE(cuda::linear_gemm_multi(ctx, q.data(), dx.ptr<float>(), ys.data(), static_cast<int>(q.size()), T))
        << "the one-launch form refused the table";
    ASSERT_EQ(cudaStreamSynchronize(gpu->stream()), cudaSuccess);
  }
  expect_table(*cpu, *gpu, name, mats, hw, x, outs, in, T);
}

// The prefill form with the layer's input norm through the backend (CudaBackend::rmsnorm_linear_multi, T > 1): the
// norm computed straight into the exact-code loop's rows (FERN_CUDA_NORM_ROWS=fused, the default) against the CPU's
// rmsnorm then linear (kNmse), and bit for bit against rmsnorm then linear_multi (separate): the same rows, the same
// GEMM.
void run_gemm_norm_table(const char* name, const std::vector<Mat>& mats, int64_t in, int T) {
  SCOPED_TRACE(name);
  GpuTable tb(name, mats, in, 64, T, {4000, 19, 3}, 93 + uint64_t(in) + uint64_t(T));
  auto& [gpu, cpu, st, hw, dw, x, dx, outs, ws, q, ys] = tb;
  auto [nw, xn_ref, dnw, dxn, eps] = norm_setup(tb, in, T, 58 + uint64_t(in));
  std::vector<std::vector<float>> got[2];
  for (int fused = 1; fused >= 0; --fused) {
    test::EnvGuard sw("FERN_CUDA_NORM_ROWS", fused ? "fused" : "separate");
    for (size_t i = 0; i < outs.size(); ++i) outs[i] = test::nan_filled(*gpu, T, mats[i].out);
    gpu->rmsnorm_linear_multi(outs, dx, dnw, eps, dxn, ws);
    expect_table(*cpu, *gpu, fused ? "norm rows fused" : "norm rows separate", mats, hw, xn_ref, outs, in, T);
    for (const Tensor& o : outs) got[fused].push_back(test::download(*gpu, o));
  }
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(test::same_bits(got[0][i], got[1][i])) << "matrix " << i;
}

TEST(CudaLinearMulti, PrefillOneLaunch) {
  FERN_REQUIRE_GPU();
  if (!cuda::gemm_wg_supported()) GTEST_SKIP() << "no sm_90a build or compute capability 9.0 device";
  run_gemm_table("gemm gdn qkv|z|b|a T=300", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 300, false);
  run_gemm_table("gemm attn q|k|v T=100", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 64, 100, false);
  run_gemm_table("gemm odd rows g128 T=70", {{129, 4}, {17, 4}, {1, 4}}, 640, 128, 70, false);
  run_gemm_table("gemm 8-bit T=200", {{256, 8}, {1, 8}}, 2048, 64, 200, false);
  run_gemm_table("backend gdn T=300", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 300, true);
  run_gemm_norm_table("backend norm gdn T=300", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 300);
  run_gemm_norm_table("backend norm attn T=17", {{8192, 4}, {512, 4}, {512, 4}}, 2048, 17);
  run_gemm_norm_table("backend norm narrow T=2000", {{129, 4}, {64, 4}}, 192, 2000);
  {
    GpuTable tb("norm rows refused", {{64, 4}}, 2048, 64, 300, {4000, 19, 3}, 94);
    Tensor dnw = test::upload_f32(*tb.gpu, test::randn(2048, 59), {2048});
    Tensor dxn = tb.gpu->alloc(DType::F32, {300, 2048});
    test::EnvGuard bad("FERN_CUDA_NORM_ROWS", "both");
    EXPECT_THROW(tb.gpu->rmsnorm_linear_multi(tb.outs, tb.dx, dnw, 1e-6f, dxn, tb.ws), std::exception);
  }
  {
    test::EnvGuard off("FERN_GEMM_MULTI", "0");  // one launch per matrix, as before
    run_gemm_table("backend gdn T=300, FERN_GEMM_MULTI=0", {{8192, 4}, {4096, 4}, {32, 4}, {32, 4}}, 2048, 64, 300,
                   true);
  }
  // The refusals (nothing launched: checked before any memory is touched): no workspace; a matrix of another group
  // size; too few rows for the GEMM.
  cuda::Ctx ctx;
  ctx.gemm_wg = true;
  cuda::QW a, b;
  a.bits = b.bits = 4;
  a.in = b.in = 2048;
  a.gs = b.gs = 64;
  a.out = b.out = 128;
  float* ys[2] = {nullptr, nullptr};
  const cuda::QW same[2] = {a, b};
  EXPECT_FALSE(cuda::linear_gemm_multi(ctx, same, nullptr, ys, 2, 300)) << "no workspace";
  ctx.gemm_ws = &ctx;  // never dereferenced: every case below is refused first
  ctx.gemm_ws_bytes = cuda::xbf_bytes(300, 2048);
  EXPECT_FALSE(cuda::linear_gemm_multi(ctx, same, nullptr, ys, 2, 2)) << "two rows";
  b.gs = 32;
  const cuda::QW mixed[2] = {a, b};
  EXPECT_FALSE(cuda::linear_gemm_multi(ctx, mixed, nullptr, ys, 2, 300)) << "group sizes differ";
}

}  // namespace
}  // namespace fern
