#include <gtest/gtest.h>

#include "core/bf16.h"
#include "core/tensor.h"

namespace fern {

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to the even mantissa (1.0).
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);
  // 1 + 3*2^-8 is a tie between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to the even one.
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(Tensor, SliceAndReshape) {
  HostBuffer buf(6 * 4 * sizeof(float));
  Tensor t = buf.tensor(DType::F32, {6, 4});
  EXPECT_EQ(t.numel(), 24);
  Tensor s = t.slice0(2, 3);
  EXPECT_EQ(s.ptr<float>(), t.ptr<float>() + 8);
  EXPECT_EQ(s.dim(0), 3);
  EXPECT_THROW(t.slice0(5, 2), InternalError);
  EXPECT_EQ(t.reshape({24}).dim(0), 24);
  EXPECT_THROW(t.reshape({5}), InternalError);
}

}  // namespace fern
