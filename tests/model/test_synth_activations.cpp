// The value scales of synthetic weights (docs/FORMATS.md) keep activations finite and non-degenerate: the tiny
// preset run on the CPU backend over a 1024-token context, in both layouts. Every layer's residual stays at a
// moderate RMS, every mixer and MoE block contributes a visible share of it at the end of the context (not
// drowned, not exploding; attention the least, see below), and --logit-scale makes the distribution peaked.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/synth.h"

namespace fern {
namespace {

struct ActivationStats {
  std::map<std::string, double> rms;  // of each dumped activation over the last 128 positions
  bool finite = true;
  double top_prob = 0;                // largest softmax probability of the last token's logits
  double logit_std = 0;
};

ActivationStats run(const ModelWeights& w, int64_t tokens, int64_t chunk, uint64_t seed) {
  auto be = make_cpu_backend();
  auto st = be->new_state(w.config, tokens);
  std::mt19937_64 rng(seed);
  ActivationStats r;
  std::vector<float> logits(static_cast<size_t>(w.config.vocab_size));
  for (int64_t p = 0; p < tokens; p += chunk) {
    const int64_t T = std::min(chunk, tokens - p);
    be->begin_forward();
    Tensor ids = be->scratch(DType::I32, {T});
    for (int64_t t = 0; t < T; ++t) ids.ptr<int32_t>()[t] = static_cast<int32_t>(rng() % 151643);
    Tensor out = be->scratch(DType::F32, {1, w.config.vocab_size});
    ForwardOptions fo;
    const bool last = p + T >= tokens;
    fo.dump = [&](const std::string& name, Tensor t) {
      const int64_t n = t.numel();
      const float* x = t.ptr<float>();
      for (int64_t i = 0; i < n; ++i) r.finite &= std::isfinite(x[i]);
      if (!last) return;
      // RMS over the last 128 positions of the context (one position alone fluctuates too much).
      const int64_t cols = t.dim(1), rows = std::min<int64_t>(128, T);
      double s = 0;
      for (int64_t i = (T - rows) * cols; i < T * cols; ++i) s += double(x[i]) * x[i];
      r.rms[name] = std::sqrt(s / double(rows * cols));
    };
    forward(*be, w, *st, ids, out, fo);
    if (last) {
      const float* l = out.ptr<float>();
      double mx = l[0], mean = 0, var = 0;
      for (int64_t v = 0; v < w.config.vocab_size; ++v) {
        mx = std::max(mx, double(l[v]));
        mean += l[v];
      }
      mean /= w.config.vocab_size;
      double z = 0;
      for (int64_t v = 0; v < w.config.vocab_size; ++v) {
        z += std::exp(l[v] - mx);
        var += (l[v] - mean) * (l[v] - mean);
      }
      r.top_prob = 1.0 / z;
      r.logit_std = std::sqrt(var / w.config.vocab_size);
    }
  }
  return r;
}

// Thresholds from the measured run (tiny preset, seed 1, 1024 random tokens, RMS over positions 896-1023):
// residual 1.0 (embedding) growing to 1.65 after layer 3; GDN mixers 0.57-0.59, MoE blocks 0.38-0.42; the
// attention mixer only 0.096-0.098: with unit q/k norm gains the scores q.k/16 have std ~1, attention spreads
// over most of the context and the averaged values shrink as the context grows (docs/FORMATS.md; the values are
// kept because committed golden fixtures hash these exact weights). Logit std = logit_scale within 1%; top-1
// probability 5e-4 at scale 1 and 0.94 at scale 8 (mlx4). Bounds: residual in [0.5, 4], GDN and MoE blocks >= 10%
// of the residual, attention >= 3%, logit std within 20% of the scale, top-1 < 0.02 at scale 1, > 0.1 at scale 8.
TEST(SynthActivations, FiniteAndNonDegenerateOverLongContext) {
  const ModelConfig cfg = synth_preset("tiny");
  for (auto [fmt, scale] : {std::pair{CheckpointFormat::HfBf16, 1.0f}, std::pair{CheckpointFormat::Mlx4, 8.0f}}) {
    SynthOptions o;
    o.seed = 1;
    o.format = fmt;
    o.logit_scale = scale;
    auto w = synth_weights(cfg, o);
    const ActivationStats r = run(*w, 1024, 512, 7);
    EXPECT_TRUE(r.finite);
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
      const double res = r.rms.at(fmt::format("L{}.out", l));
      EXPECT_GT(res, 0.5) << l;
      EXPECT_LT(res, 4.0) << l;
      for (const char* block : {"mixer_out", "moe_out"}) {
        const double b = r.rms.at(fmt::format("L{}.{}", l, block));
        std::printf("%s L%d %s rms %.3f of residual %.3f\n", format_name(fmt), l, block, b, res);
        const bool attention = cfg.is_attention_layer(l) && std::string(block) == "mixer_out";
        EXPECT_GT(b, (attention ? 0.03 : 0.1) * res) << format_name(fmt) << " L" << l << " " << block;
      }
    }
    std::printf("%s scale %.0f: top-1 probability %.4f, logit std %.3f\n", format_name(fmt), scale, r.top_prob,
                r.logit_std);
    EXPECT_NEAR(r.logit_std, scale, 0.2 * scale);
    if (scale == 1.0f) EXPECT_LT(r.top_prob, 0.02);
    else EXPECT_GT(r.top_prob, 0.1);
  }
}

}  // namespace
}  // namespace fern
