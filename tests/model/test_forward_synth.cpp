// The forward pass on the CPU backend over the project's synthetic `tiny` checkpoint weights in both layouts
// (HF bf16, whose fused gate_up binds as strided expert stacks, and MLX 4-bit): the two layouts give the same
// model up to 4-bit quantization error, and prefill + decode equals one prefill on the HF layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/synth.h"
#include "test_util.h"

namespace fern {
namespace {

std::vector<float> run(Backend& be, const ModelWeights& w, SequenceState& st, const std::vector<int32_t>& tok,
                       size_t begin, size_t end, bool all) {
  const int64_t T = int64_t(end - begin), rows = all ? T : 1;
  be.begin_forward();
  Tensor ids = be.scratch(DType::I32, {T});
  std::copy(tok.begin() + begin, tok.begin() + end, ids.ptr<int32_t>());
  Tensor logits = be.scratch(DType::F32, {rows, w.config.vocab_size});
  ForwardOptions opt;
  opt.all_logits = all;
  forward(be, w, st, ids, logits, opt);
  return std::vector<float>(logits.ptr<float>(), logits.ptr<float>() + logits.numel());
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  auto u = test::randu(n, seed, 0.0f, 150000.0f);
  return std::vector<int32_t>(u.begin(), u.end());
}

TEST(ForwardSynth, HfAndMlxLayoutsAgree) {
  const ModelConfig cfg = synth_preset("tiny");
  SynthOptions o;
  o.seed = 4;
  o.format = CheckpointFormat::HfBf16;
  auto hf = synth_weights(cfg, o);
  o.format = CheckpointFormat::Mlx4;
  auto mlx = synth_weights(cfg, o);
  auto be = make_cpu_backend();
  const auto tok = tokens(80, 1);
  auto s1 = be->new_state(cfg, 80), s2 = be->new_state(cfg, 80);
  auto a = run(*be, *hf, *s1, tok, 0, tok.size(), true);
  auto b = run(*be, *mlx, *s2, tok, 0, tok.size(), true);
  for (float x : b) ASSERT_TRUE(std::isfinite(x));
  const double e = test::nmse(b.data(), a.data(), a.size());
  // The scale of "unrelated": the same model with weights of another seed.
  o.format = CheckpointFormat::HfBf16;
  o.seed = 5;
  auto other = synth_weights(cfg, o);
  auto s3 = be->new_state(cfg, 80);
  auto c = run(*be, *other, *s3, tok, 0, tok.size(), true);
  const double unrelated = test::nmse(c.data(), a.data(), a.size());
  std::printf("tiny synth: mlx4 vs hf logits NMSE %.3g (another seed: %.3g)\n", e, unrelated);
  // 4-bit g64 quantization of every matrix, compounded over 4 layers and through routing flips: measured NMSE
  // 0.050, against 2.0 for unrelated weights. A binding mistake (gate/up swapped, a wrong norm offset, a
  // transposed conv) lands near the unrelated value.
  EXPECT_LT(e, 0.2);
  EXPECT_GT(unrelated, 0.5);
  EXPECT_GT(e, 1e-6);  // and the two really are different weights
}

TEST(ForwardSynth, HfPrefillThenDecodeEqualsOnePrefill) {
  const ModelConfig cfg = synth_preset("tiny");
  SynthOptions o;
  o.format = CheckpointFormat::HfBf16;
  auto w = synth_weights(cfg, o);
  auto be = make_cpu_backend();
  const auto tok = tokens(72, 2);
  auto ref_state = be->new_state(cfg, 72);
  auto ref = run(*be, *w, *ref_state, tok, 0, 72, true);
  auto st = be->new_state(cfg, 72);
  run(*be, *w, *st, tok, 0, 66, false);
  const int64_t V = cfg.vocab_size;
  double worst = 0;
  for (size_t i = 66; i < 72; ++i) {
    auto l = run(*be, *w, *st, tok, i, i + 1, false);
    worst = std::max(worst, test::nmse(l.data(), &ref[i * V], V));
  }
  std::printf("tiny synth hf: decode vs prefill worst NMSE %.3g\n", worst);
  // As in test_forward_cpu: only the fp32 rounding of recurrent vs chunked GDN differs.
  EXPECT_LT(worst, 1e-9);
}

}  // namespace
}  // namespace fern
