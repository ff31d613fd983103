// The engine's prefill chunk: 0 takes the backend's hint, a chosen size changes how a prompt is split but not its
// result, and a negative size is refused with an error.
#include <gtest/gtest.h>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "test_util.h"

namespace fern {
namespace {

std::unique_ptr<Engine> tiny_engine(int64_t chunk) {
  SynthOptions so;
  so.seed = 3;
  EngineOptions eo;
  eo.max_context = 128;
  eo.prefill_chunk = chunk;
  return std::make_unique<Engine>(make_cpu_backend(1), synth_weights(synth_preset("tiny"), so), eo);
}

TEST(EngineChunk, ZeroTakesTheBackendsHint) {
  auto e = tiny_engine(0);
  EXPECT_EQ(e->prefill_chunk(), e->backend().prefill_chunk_hint());
  EXPECT_EQ(e->prefill_chunk(), 512);  // the CPU backend's hint
  e->set_prefill_chunk(9);
  EXPECT_EQ(e->prefill_chunk(), 9);
  e->set_prefill_chunk(0);
  EXPECT_EQ(e->prefill_chunk(), 512);
  EXPECT_THROW(e->set_prefill_chunk(-1), Error);
  EXPECT_EQ(e->prefill_chunk(), 512);  // unchanged by the refused value
  EXPECT_THROW(tiny_engine(-4), Error);
}

TEST(EngineChunk, ChunkSizeDoesNotChangeTheLogits) {
  auto e = tiny_engine(0);
  std::vector<int32_t> prompt(61);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 200);
  std::vector<float> whole, split;
  auto st = e->new_state();
  ASSERT_TRUE(e->prefill(*st, prompt, whole));
  e->set_prefill_chunk(7);  // 61 = 8 x 7 + 5: a short last chunk
  auto st2 = e->new_state();
  ASSERT_TRUE(e->prefill(*st2, prompt, split));
  ASSERT_EQ(whole.size(), split.size());
  // The same operations on the same values, grouped into different forward calls; the CPU backend's row-wise
  // kernels and sequential scans make the results agree to rounding (a state carried wrongly between chunks
  // would be off by far more than 1e-10).
  EXPECT_LT(test::nmse(split.data(), whole.data(), whole.size()), 1e-10);
  EXPECT_EQ(st2->pos, int64_t(prompt.size()));
}

}  // namespace
}  // namespace fern
