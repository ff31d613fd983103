// CUDA GEMV (linear) against the CPU backend at the real shapes of Qwen3.6-35B-A3B (8192x2048 qkv, 512x2048 and
// 2048x512 experts, 2048x4096 out_proj, 248320x2048 lm_head, 8-bit router) and at awkward ones (odd row counts,
// rows narrower than a warp's chunks, group size 32, several token rows, bf16 dense).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace fern {
namespace {

struct Case {
  const char* name;
  int64_t out, in;
  int bits, gs, T;
};

// Both sides accumulate in fp32 over exactly dequantized weights; only the summation order and the GPU's
// folded offset (sum x (OFF+q) - OFF sum x, which cancels about log2(OFF/8) = 4-5 bits) differ. Measured on the
// H200: NMSE 1.6e-12..3.9e-12 (4-bit), 4e-14..9e-14 (8-bit, bf16) (docs/notes/cuda-decode-v1.md); 1e-9 leaves
// room and still catches any wrong nibble, group or row (those give NMSE > 1e-3).
constexpr double kNmse = 1e-9;

std::vector<float> run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  auto gpu = test::make_gpu();
  auto cpu = make_cpu_backend();
  test::OwnedStorage st;
  const uint64_t seed = uint64_t(c.out * 31 + c.in * 7 + c.bits + c.T);
  LinearWeight hw = c.bits == 16 ? test::raw_dense(st, c.name, 0, c.out, c.in, seed)
                                 : test::raw_affine(st, c.name, 0, c.out, c.in, c.bits, c.gs, seed);
  LinearWeight dw = gpu->to_device(hw);
  auto x = test::randn(size_t(c.T * c.in), seed + 1);
  std::vector<float> ref(size_t(c.T * c.out), 0.0f);
  cpu->linear(test::host_f32(ref, {c.T, c.out}), test::host_f32(x, {c.T, c.in}), hw);
  Tensor dx = test::upload_f32(*gpu, x, {c.T, c.in});
  Tensor dy = test::nan_filled(*gpu, c.T, c.out);
  gpu->linear(dy, dx, dw);
  auto got = test::download(*gpu, dy);
  const double e = test::nmse(got.data(), ref.data(), got.size());
  std::printf("linear %-28s [%6ld x %5ld] %2d-bit T=%d  NMSE %.3e\n", c.name, long(c.out), long(c.in), c.bits, c.T, e);
  EXPECT_LT(e, kNmse);  // NaN (an unwritten output) fails too
  return got;
}

TEST(CudaLinear, RealShapes) {
  FERN_REQUIRE_GPU();
  for (const Case& c : {Case{"in_proj_qkv", 8192, 2048, 4, 64, 1}, Case{"expert gate", 512, 2048, 4, 64, 1},
                        Case{"expert down", 2048, 512, 4, 64, 1}, Case{"out_proj", 2048, 4096, 4, 64, 1},
                        Case{"in_proj_b", 32, 2048, 4, 64, 1}, Case{"router 8-bit", 256, 2048, 8, 64, 1},
                        Case{"shared_expert_gate 8-bit", 1, 2048, 8, 64, 1},
                        Case{"lm_head", 248320, 2048, 4, 64, 1}})
    run_case(c);
}

TEST(CudaLinear, AwkwardShapes) {
  FERN_REQUIRE_GPU();
  for (const Case& c : {Case{"odd rows", 37, 2048, 4, 64, 1}, Case{"narrow 4-bit", 45, 192, 4, 64, 1},
                        Case{"group 32", 77, 96, 4, 32, 1}, Case{"group 128", 129, 640, 4, 128, 2},
                        Case{"8-bit narrow", 19, 64, 8, 64, 1}, Case{"8-bit group 32", 300, 4096, 8, 32, 1},
                        Case{"several rows", 1000, 2048, 4, 64, 5}, Case{"bf16", 515, 2048, 16, 0, 1},
                        Case{"bf16 narrow", 33, 24, 16, 0, 3}, Case{"bf16 wide", 64, 8192, 16, 0, 1}})
    run_case(c);
}

// The CUDA-core GEMV's software pipeline (linear.cu; FERN_CUDA_GEMV_TC=0 keeps the lm_head-sized cases off the
// tensor-core kernel): NB register buffers, the first NB steps requested before the PDL wait.
// Depth 2 is the default (depth 3 measured slower for lm_head); FERN_CUDA_GEMV_NB forces 2 or 3 on every plain GEMV
// with 32 lanes per row. Row counts whose step count per warp is not a multiple of the depth, few steps per warp (8192 rows:
// two, fewer than depth 3), several token rows, and the 8-bit and bf16 variants (32 lanes per row from 1024 and
// 512 inputs).
// The packed scales and biases of the 4-bit GEMV (FERN_CUDA_GEMV_SB=row, the default: one word per lane and row per
// step, shuffled to the lanes; docs/notes/cuda-decode-v20-burst.md) against two 2-byte loads per chunk (chunk): the
// same values through the same arithmetic, so the same bits, and both against the CPU (run_case). The packed form
// takes widths of 2,048, 4,096 and 6,144 (one, two and three steps per row group) on the two- and three-block
// kernels (8,192 and 40,001 rows: FERN_CUDA_GEMV_OCC's three blocks per SM), several token rows; 8-bit, groups of
// 128 and a width of 1,024 fall back to the chunk loads and must match too. An unknown value is refused.
TEST(CudaLinear, PackedScalesSameBits) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  for (const Case& c : {Case{"sb qkv", 8192, 2048, 4, 64, 1}, Case{"sb out_proj", 2048, 4096, 4, 64, 1},
                        Case{"sb odd rows", 40001, 2048, 4, 64, 1}, Case{"sb three steps", 333, 6144, 4, 64, 1},
                        Case{"sb T=3", 1000, 2048, 4, 64, 3}, Case{"sb 8-bit", 3000, 2048, 8, 64, 1},
                        Case{"sb group 128", 129, 2048, 4, 128, 2}, Case{"sb K=1024", 700, 1024, 4, 64, 1}}) {
    std::vector<float> chunk, row;
    {
      test::EnvGuard sb("FERN_CUDA_GEMV_SB", "chunk");
      chunk = run_case(c);
    }
    {
      test::EnvGuard sb("FERN_CUDA_GEMV_SB", "row");
      row = run_case(c);
    }
    EXPECT_EQ(chunk, row) << c.name;
  }
  test::EnvGuard bad("FERN_CUDA_GEMV_SB", "word");
  EXPECT_THROW(run_case(Case{"sb refused", 64, 2048, 4, 64, 1}), std::exception);
}

TEST(CudaLinear, PipelineDepths) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  test::each_value("FERN_CUDA_GEMV_NB", {"2", "3"}, [] {
    for (const Case& c : {Case{"depth odd rows", 40001, 2048, 4, 64, 1}, Case{"depth few steps", 8192, 2048, 4, 64, 1},
                          Case{"depth T=2", 32773, 2048, 4, 64, 2}, Case{"depth 8-bit", 33333, 1024, 8, 64, 1},
                          Case{"depth bf16", 32769, 512, 16, 0, 1}})
      run_case(c);
  });
}

// The CUDA-core GEMV's block size (FERN_CUDA_GEMV_TC=0) forced both ways: 512-thread blocks, one per SM, for every GEMV with rows of 32 lanes
// (FERN_CUDA_GEMV_WIDE=1), and 256-thread blocks for all (=0); by default (the other tests) 512 threads only for
// lm_head-sized GEMVs. The real shapes, lm_head-sized and odd row counts, several token rows, 8-bit and bf16, and
// with depth 3 requested too (the wide kernel keeps depth 2).
TEST(CudaLinear, WideBlocks) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  test::each_value("FERN_CUDA_GEMV_WIDE", {"1", "0"}, [] {
    test::each_value("FERN_CUDA_GEMV_NB", {"2", "3"}, [] {
      for (const Case& c : {Case{"wide qkv", 8192, 2048, 4, 64, 1}, Case{"wide out_proj", 2048, 4096, 4, 64, 1},
                            Case{"wide odd rows", 40001, 2048, 4, 64, 1}, Case{"wide T=3", 1000, 2048, 4, 64, 3},
                            Case{"wide 8-bit", 33333, 1024, 8, 64, 1}, Case{"wide bf16", 515, 2048, 16, 0, 2},
                            Case{"wide narrow (256 threads)", 300, 256, 4, 64, 1}})
        run_case(c);
    });
  });
}

// Three 256-thread blocks per SM for the 4-bit rows of 32 lanes with more than two blocks' work per SM
// (FERN_CUDA_GEMV_OCC=3, the default; the others keep their kernel), and =2 for all: the real shapes, odd rows,
// several token rows, 8-bit and a narrow bf16 case; an unknown value is an error.
TEST(CudaLinear, ThreeBlocksPerSm) {
  FERN_REQUIRE_GPU();
  test::EnvGuard cuda_cores("FERN_CUDA_GEMV_TC", "0");
  test::each_value("FERN_CUDA_GEMV_OCC", {"3", "2"}, [] {
    for (const Case& c : {Case{"occ qkv", 8192, 2048, 4, 64, 1}, Case{"occ out_proj", 2048, 4096, 4, 64, 1},
                          Case{"occ odd rows", 40001, 2048, 4, 64, 1}, Case{"occ T=3", 1000, 2048, 4, 64, 3},
                          Case{"occ 8-bit", 33333, 1024, 8, 64, 1}, Case{"occ bf16", 515, 2048, 16, 0, 2}})
      run_case(c);
  });
  test::EnvGuard bad("FERN_CUDA_GEMV_OCC", "4");
  EXPECT_THROW(run_case(Case{"occ refused", 64, 2048, 4, 64, 1}), std::exception);
}

// The tensor-core GEMV (linear.cu linear_tc_kernel, gemv_tc.cuh; by default for lm_head-sized 4-bit weights with
// groups a multiple of 64, FERN_CUDA_GEMV_TC=1 for all), with two and three item buffers per warp
// (FERN_CUDA_GEMV_TC_NB): blocks whose warps share
// a tile's K blocks (few tiles per block: 8192 rows, 37 rows, one row) and blocks whose warps own whole tiles (from
// 8 tiles per block: 40,001 rows and lm_head), row counts that leave a tile partly empty, K not a multiple of the
// 256-wide item (192, 640, 64: the last item's groups past the row are zero), groups of 128, K = 4096, several
// token rows; then the same shapes on the CUDA cores (FERN_CUDA_GEMV_TC=0), so both loops stay checked.
// The bound: the tensor cores see x as bf16 hi + lo (2^-18 of x left out: NMSE ~1e-11 expected) and add in fp32;
// the other errors are the CUDA-core loop's. 1e-9 is the GEMV bound above, and a wrong code pair, group, K slot
// or row gives NMSE > 1e-3.
TEST(CudaLinear, TensorCoreLoop) {
  FERN_REQUIRE_GPU();
  test::each_value("FERN_CUDA_GEMV_TC", {"1", "0"}, [](const char* tc) {
    test::each_value("FERN_CUDA_GEMV_TC_NB", {"2", "3"}, [tc](const char* nb) {
      if (tc[0] == '0' && nb[0] == '3') return;  // the CUDA-core loop has no item buffers to vary
      for (const Case& c : {Case{"tc qkv", 8192, 2048, 4, 64, 1}, Case{"tc out_proj", 2048, 4096, 4, 64, 1},
                            Case{"tc odd rows", 37, 2048, 4, 64, 1}, Case{"tc one row", 1, 2048, 4, 64, 1},
                            Case{"tc whole tiles", 40001, 2048, 4, 64, 1}, Case{"tc T=3", 33797, 1024, 4, 64, 3},
                            Case{"tc narrow", 45, 192, 4, 64, 1}, Case{"tc group 128", 129, 640, 4, 128, 2},
                            Case{"tc K=64", 17, 64, 4, 64, 1}, Case{"tc T=5", 1000, 2048, 4, 64, 5},
                            Case{"tc expert down", 2048, 512, 4, 64, 1}})
        run_case(c);
    });
  });
}

TEST(CudaLinear, BadWeightIsAnError) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  test::OwnedStorage st;
  LinearWeight hw = test::raw_affine(st, "w", 0, 8, 64, 4, 64, 1);
  LinearWeight dw = gpu->to_device(hw);
  dw.bits = 3;
  Tensor x = gpu->alloc(DType::F32, {1, 64}), y = gpu->alloc(DType::F32, {1, 8});
  EXPECT_THROW(gpu->linear(y, x, dw), Error);
  EXPECT_THROW(gpu->linear(y, x, hw), Error);  // host weights given to the GPU backend
}

}  // namespace
}  // namespace fern
