// The CUDA scratch arena in both forms (cuda/scratch_arena.h): alignment, contiguity, marks, memory that holds what is
// written across the contiguous form's mappings, growth refused during a capture; and the backend's scratch scopes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "cuda/scratch_arena.h"
#include "cuda_test_util.h"

namespace fern {
namespace {

using cuda::ScratchArena;

// Fills `n` floats at `p` with a pattern seeded by `seed`, and reads them back.
void write_pattern(void* p, size_t n, float seed) {
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = seed + float(i % 1000);
  ASSERT_EQ(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
}
bool holds_pattern(const void* p, size_t n, float seed) {
  std::vector<float> h(n);
  if (cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (size_t i = 0; i < n; ++i)
    if (h[i] != seed + float(i % 1000)) return false;
  return true;
}

class ScratchArenaForms : public ::testing::TestWithParam<ScratchArena::Form> {};

TEST_P(ScratchArenaForms, AllocatesMarksAndKeepsData) {
  FERN_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ScratchArena arena(0, GetParam());
  if (GetParam() == ScratchArena::Form::Blocks) {
    EXPECT_EQ(arena.form(), ScratchArena::Form::Blocks);
  }
  std::printf("form %s\n", arena.form() == ScratchArena::Form::Contiguous ? "contiguous" : "blocks");
  // Awkward sizes: sub-alignment, one past a multiple of 256, and two that cross the contiguous form's 64 MiB growth
  // step and the block form's 256 MiB block.
  const std::vector<size_t> floats = {3, 65, 20'000'000, 1, 90'000'000};
  std::vector<void*> p;
  size_t live = 0;
  for (size_t i = 0; i < floats.size(); ++i) {
    p.push_back(arena.alloc(floats[i] * sizeof(float)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.back()) % 256, 0u);
    live += (floats[i] * sizeof(float) + 255) / 256 * 256;
    if (arena.form() == ScratchArena::Form::Contiguous && i > 0) {  // one range: each right after the last
      EXPECT_EQ(static_cast<char*>(p[i - 1]) + (floats[i - 1] * sizeof(float) + 255) / 256 * 256, p[i]);
    }
  }
  for (size_t i = 0; i < floats.size(); ++i) write_pattern(p[i], floats[i], float(i) * 1000.0f);
  for (size_t i = 0; i < floats.size(); ++i) EXPECT_TRUE(holds_pattern(p[i], floats[i], float(i) * 1000.0f)) << i;
  EXPECT_EQ(arena.live_peak(), live);
  EXPECT_EQ(arena.peak_sizes().size(), floats.size());
  EXPECT_GE(arena.reserved(), live);
  if (arena.form() == ScratchArena::Form::Contiguous) {  // the growth step (64 MiB) at most above the peak
    EXPECT_LE(arena.reserved(), live + (size_t(64) << 20));
  }

  // A mark, and a return to it: the next allocation gets the same address; what came before is untouched.
  const ScratchArena::Mark m = arena.mark();
  void* a = arena.alloc(1000);
  arena.release(m);
  EXPECT_EQ(arena.alloc(1000), a);
  arena.release(m);
  EXPECT_TRUE(holds_pattern(p[4], floats[4], 4000.0f));

  // After a reset the same requests get the same addresses (a replayed graph relies on it) and nothing grows.
  const size_t reserved = arena.reserved();
  arena.reset();
  for (size_t i = 0; i < floats.size(); ++i) EXPECT_EQ(arena.alloc(floats[i] * sizeof(float)), p[i]);
  EXPECT_EQ(arena.reserved(), reserved);

  // Growth is refused while forbidden (during a graph capture), allowed again afterwards.
  arena.set_growth_allowed(false);
  EXPECT_THROW(arena.alloc(size_t(2) << 30), Error);
  arena.set_growth_allowed(true);
  void* more = arena.alloc(size_t(100) << 20);
  write_pattern(more, 25 << 20, 5.0f);
  EXPECT_TRUE(holds_pattern(more, 25 << 20, 5.0f));
  EXPECT_TRUE(holds_pattern(p[2], floats[2], 2000.0f));
}

INSTANTIATE_TEST_SUITE_P(Forms, ScratchArenaForms,
                         ::testing::Values(ScratchArena::Form::Contiguous, ScratchArena::Form::Blocks),
                         [](const auto& info) {
                           return info.param == ScratchArena::Form::Contiguous ? "Contiguous" : "Blocks";
                         });

// A request larger than the device's memory is an error, not a crash, and the arena stays usable.
TEST(ScratchArena, OutOfMemoryIsAnError) {
  FERN_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (ScratchArena::Form f : {ScratchArena::Form::Contiguous, ScratchArena::Form::Blocks}) {
    ScratchArena arena(0, f);
    size_t free_b = 0, total_b = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    EXPECT_THROW(arena.alloc(total_b + (size_t(1) << 30)), Error);
    cudaGetLastError();  // a failed cudaMalloc leaves its error behind in the runtime
    void* p = arena.alloc(4096 * sizeof(float));
    write_pattern(p, 4096, 1.0f);
    EXPECT_TRUE(holds_pattern(p, 4096, 1.0f));
  }
}

// The backend's scopes: memory taken inside a scope is handed out again after it closes.
TEST(CudaBackendScratch, ScopesReuseMemory) {
  FERN_REQUIRE_GPU();
  auto gpu = test::make_gpu();
  gpu->begin_forward();
  void* before = gpu->scratch(DType::F32, {1000}).data;
  gpu->scratch_push();
  void* inside = gpu->scratch(DType::F32, {5'000'000}).data;
  gpu->scratch_push();
  void* nested = gpu->scratch(DType::F32, {7}).data;
  gpu->scratch_pop();
  EXPECT_EQ(gpu->scratch(DType::F32, {7}).data, nested);
  gpu->scratch_pop();
  EXPECT_EQ(gpu->scratch(DType::F32, {5'000'000}).data, inside);
  EXPECT_NE(inside, before);
  EXPECT_THROW(gpu->scratch_pop(), Error);
  EXPECT_GE(gpu->scratch_live_peak(), size_t(5'000'000) * 4);
}

}  // namespace
}  // namespace fern
