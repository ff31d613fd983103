// Engine::decode with recorded steps and Engine::decode_pick, on the CPU: a backend that records a step by keeping
// the closure and replays it by running it again stands in for CUDA graphs, and picks tokens with the host Sampler's
// rule as a device would. It checks the engine's side of the contracts (the token written into the slot before a
// replay, the logits read after it, one record per state, a new record when the state changes, eager steps after a
// failed recording, FERN_DECODE_GRAPH=0; one draw stream per request whoever picks, the host's picks where the
// backend gives up, the penalties counted alike), not the graphs or kernels themselves (tests/cuda/test_cuda_forward.cpp and
// tests/cuda/test_cuda_pick.cpp run them on the GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/synth.h"
#include "ops/token_pick.h"

namespace fern {
namespace {

// Forwards every op to the CPU backend; capture_step keeps `step` without running it, replay runs it.
class ReplayingBackend final : public Backend {
 public:
  bool fail_capture = false;
  int captures = 0, replays = 0;

  std::string name() const override { return "replaying-cpu"; }
  Device device() const override { return in_->device(); }
  DType act_dtype() const override { return in_->act_dtype(); }
  void begin_forward() override { in_->begin_forward(); }
  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override { return in_->scratch(dtype, shape); }
  void scratch_push() override { in_->scratch_push(); }
  void scratch_pop() override { in_->scratch_pop(); }
  void copy(Tensor dst, Tensor src) override { in_->copy(dst, src); }
  Tensor alloc(DType dtype, const std::vector<int64_t>& shape) override { return in_->alloc(dtype, shape); }
  std::shared_ptr<const ModelWeights> upload(std::shared_ptr<const ModelWeights> host) override {
    return in_->upload(std::move(host));
  }
  std::unique_ptr<SequenceState> new_state(const ModelConfig& cfg, int64_t capacity) override {
    return in_->new_state(cfg, capacity);
  }
  void reset_state(SequenceState& s) override { in_->reset_state(s); }
  void copy_state(SequenceState& dst, const SequenceState& src) override { in_->copy_state(dst, src); }
  size_t state_bytes(const ModelConfig& cfg, int64_t capacity) const override {
    return in_->state_bytes(cfg, capacity);
  }
  void embed(Tensor out, Tensor ids, const LinearWeight& table) override { in_->embed(out, ids, table); }
  void rmsnorm(Tensor out, Tensor x, Tensor w, float eps) override { in_->rmsnorm(out, x, w, eps); }
  void add_rmsnorm(Tensor resid, Tensor delta, Tensor out, Tensor w, float eps) override {
    in_->add_rmsnorm(resid, delta, out, w, eps);
  }
  void add(Tensor out, Tensor a, Tensor b) override { in_->add(out, a, b); }
  void linear(Tensor out, Tensor x, const LinearWeight& w) override { in_->linear(out, x, w); }
  void gdn_core(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w, const ModelConfig& cfg,
                SequenceState& state, int layer) override {
    in_->gdn_core(y, mixed, z, b, a, w, cfg, state, layer);
  }
  void attn_core(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                 SequenceState& state, int layer) override {
    in_->attn_core(o, qg, k, v, w, cfg, state, layer);
  }
  void moe(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) override { in_->moe(out, x, w, cfg); }
  void argmax(Tensor ids, Tensor logits) override { in_->argmax(ids, logits); }
  void advance(SequenceState& state, int64_t n) override { in_->advance(state, n); }

  bool can_record_steps() const override { return true; }
  void capture_step(SequenceState& state, const std::function<void()>& step) override {
    if (fail_capture) fail("recording refused (test)");
    record_ = step;
    serial_ = state.serial;
    ++captures;
  }
  void replay(SequenceState& state) override {
    FERN_CHECK(record_ && serial_ == state.serial, "replay of another state's record");
    record_();  // forward() advances state.pos by the step's one token, as a graph's replay does
    ++replays;
  }
  bool holds_step_for(const SequenceState& state) const override { return record_ && serial_ == state.serial; }
  void drop_graph() override { record_ = nullptr; }

  // Picks as a device would: Sampler::sample_at on the logits with the draw stream, inside the step (so inside a
  // replay too). Every give_up_every-th pick is left to the host (-1), as a device does for a nucleus past its
  // candidates.
  bool picks = false;
  int give_up_every = 0;
  int device_picks = 0;
  bool can_pick(const PickParams& p, size_t bias_entries, int64_t vocab) const override {
    (void)p, (void)bias_entries, (void)vocab;
    return picks;
  }
  void set_pick(const PickParams& p, std::span<const std::pair<int32_t, float>> bias, std::span<const int32_t> prompt,
                std::span<const int32_t> fed) override {
    SamplingParams sp = sampling_params(p);
    sp.logit_bias.assign(bias.begin(), bias.end());
    sampler_ = std::make_unique<Sampler>(sp);
    sampler_->set_prompt(prompt);
    for (int32_t t : fed) sampler_->accept(t);
    pick_ = p;
  }
  void clear_pick() override { sampler_.reset(); }
  void pick(Tensor ids, Tensor logits) override {
    if (!sampler_) return;
    sampler_->accept(ids.ptr<int32_t>()[0]);  // the token this step was fed
    std::vector<float> l(logits.ptr<float>(), logits.ptr<float>() + logits.numel());
    last_ = sampler_->sample_at(l, pick_uniform(pick_.seed, pick_.draw++));
    ++device_picks;
    if (give_up_every > 0 && device_picks % give_up_every == 0) last_ = -1;
    if (last_ >= 0) ids.ptr<int32_t>()[0] = last_;
  }
  int32_t picked() override { return last_; }

 private:
  std::unique_ptr<Backend> in_ = make_cpu_backend(1);
  std::function<void()> record_;
  uint64_t serial_ = 0;
  std::unique_ptr<Sampler> sampler_;
  PickParams pick_;
  int32_t last_ = -1;
};

std::shared_ptr<const ModelWeights> tiny_weights() {
  SynthOptions so;
  so.seed = 5;
  return synth_weights(synth_preset("tiny"), so);
}

EngineOptions opts(bool graph) {
  EngineOptions eo;
  eo.max_context = 96;
  eo.decode_graph = graph;
  return eo;
}

// Greedy decode of `steps` tokens after `prompt`; every step's logits appended to `all`.
void greedy(Engine& e, SequenceState& st, const std::vector<int32_t>& prompt, int steps, std::vector<float>& all) {
  std::vector<float> logits;
  ASSERT_TRUE(e.prefill(st, prompt, logits));
  for (int i = 0; i < steps; ++i) {
    e.decode(st, argmax(logits), logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = (i * 41 + salt * 13 + 3) % 200;
  return p;
}

TEST(EngineRecorded, ReplayedStepsGiveTheEagerLogits) {
  auto w = tiny_weights();
  auto rb = std::make_unique<ReplayingBackend>();
  ReplayingBackend* fake = rb.get();
  Engine rec(std::move(rb), w, opts(true));
  Engine eager(make_cpu_backend(1), w, opts(false));
  ASSERT_TRUE(rec.decode_graph());
  EXPECT_FALSE(eager.decode_graph());  // the CPU backend records nothing

  std::vector<float> got, want;
  auto a = rec.new_state();
  auto b = eager.new_state();
  greedy(rec, *a, prompt_of(11, 1), 12, got);
  greedy(eager, *b, prompt_of(11, 1), 12, want);
  // The same CPU ops on the same values in the same order: identical bits. A replay that ran before the token
  // reached the slot would feed the previous token and differ from the second step on.
  EXPECT_EQ(got, want);
  EXPECT_EQ(a->pos, b->pos);
  EXPECT_EQ(fake->captures, 1);
  EXPECT_EQ(fake->replays, 11);
  EXPECT_EQ(rec.recorded_steps(), 1);
  EXPECT_EQ(rec.replayed_steps(), 11);

  // The next request on the same state (reset and prefilled again) replays the same record.
  got.clear(), want.clear();
  rec.backend().reset_state(*a);
  eager.backend().reset_state(*b);
  greedy(rec, *a, prompt_of(7, 2), 5, got);
  greedy(eager, *b, prompt_of(7, 2), 5, want);
  EXPECT_EQ(got, want);
  EXPECT_EQ(fake->captures, 1);
  EXPECT_EQ(fake->replays, 16);
}

TEST(EngineRecorded, AnotherStateGetsItsOwnRecord) {
  auto w = tiny_weights();
  auto rb = std::make_unique<ReplayingBackend>();
  ReplayingBackend* fake = rb.get();
  Engine rec(std::move(rb), w, opts(true));
  Engine eager(make_cpu_backend(1), w, opts(false));
  auto a = rec.new_state(), b = rec.new_state();
  auto ra = eager.new_state(), rb2 = eager.new_state();
  std::vector<float> la, lb, ea, eb;
  ASSERT_TRUE(rec.prefill(*a, prompt_of(9, 3), la));
  ASSERT_TRUE(rec.prefill(*b, prompt_of(5, 4), lb));
  ASSERT_TRUE(eager.prefill(*ra, prompt_of(9, 3), ea));
  ASSERT_TRUE(eager.prefill(*rb2, prompt_of(5, 4), eb));
  // a, a, b, b, a: records for a, then b, then a again (one record at a time); never b's record on a.
  for (char c : std::string("aabba")) {
    auto& st = c == 'a' ? *a : *b;
    auto& ref = c == 'a' ? *ra : *rb2;
    auto& l = c == 'a' ? la : lb;
    auto& e = c == 'a' ? ea : eb;
    rec.decode(st, argmax(l), l);
    eager.decode(ref, argmax(e), e);
    EXPECT_EQ(l, e) << "step on " << c;
  }
  EXPECT_EQ(fake->captures, 3);
  EXPECT_EQ(fake->replays, 2);
  EXPECT_EQ(a->pos, 9 + 3);
  EXPECT_EQ(b->pos, 5 + 2);
}

TEST(EngineRecorded, AFailedRecordingLeavesEagerSteps) {
  auto w = tiny_weights();
  auto rb = std::make_unique<ReplayingBackend>();
  rb->fail_capture = true;
  ReplayingBackend* fake = rb.get();
  Engine rec(std::move(rb), w, opts(true));
  Engine eager(make_cpu_backend(1), w, opts(false));
  std::vector<float> got, want;
  auto a = rec.new_state();
  auto b = eager.new_state();
  greedy(rec, *a, prompt_of(6, 5), 4, got);
  greedy(eager, *b, prompt_of(6, 5), 4, want);
  EXPECT_EQ(got, want);  // the step that tried to record still ran (eagerly) and gave its logits
  EXPECT_FALSE(rec.decode_graph());
  EXPECT_EQ(fake->replays, 0);
  EXPECT_EQ(a->pos, 6 + 4);
}

TEST(EngineRecorded, EnvironmentTurnsItOff) {
  auto w = tiny_weights();
  ::setenv("FERN_DECODE_GRAPH", "0", 1);
  Engine off(std::make_unique<ReplayingBackend>(), w, opts(true));
  ::setenv("FERN_DECODE_GRAPH", "1", 1);
  Engine on(std::make_unique<ReplayingBackend>(), w, opts(false));
  ::setenv("FERN_DECODE_GRAPH", "yes", 1);
  EXPECT_THROW(Engine(std::make_unique<ReplayingBackend>(), w, opts(true)), Error);  // a typo is an error
  ::unsetenv("FERN_DECODE_GRAPH");
  EXPECT_FALSE(off.decode_graph());
  EXPECT_TRUE(on.decode_graph());
}

// The tokens a picking request gets: draw i of the seed's stream picks token i (Sampler::sample_at), the first from
// the prefill's logits; the reference decodes with plain steps and picks each token on the host.
std::vector<int32_t> reference_picks(const std::shared_ptr<const ModelWeights>& w, const SamplingParams& sp,
                                     const std::vector<int32_t>& prompt, int n) {
  Engine e(make_cpu_backend(1), w, opts(false));
  auto st = e.new_state();
  std::vector<float> logits;
  EXPECT_TRUE(e.prefill(*st, prompt, logits));
  Sampler s(sp);
  s.set_prompt(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(s.sample_at(logits, pick_uniform(*sp.seed, uint64_t(i))));
    s.accept(out.back());
    if (i + 1 < n) e.decode(*st, out.back(), logits);
  }
  return out;
}

std::vector<int32_t> engine_picks(Engine& e, const SamplingParams& sp, const std::vector<int32_t>& prompt, int n) {
  auto st = e.new_state();
  std::vector<float> logits;
  EXPECT_TRUE(e.prefill(*st, prompt, logits));
  e.begin_pick(sp, prompt);
  std::vector<int32_t> out{e.pick_host(logits)};
  while (static_cast<int>(out.size()) < n) out.push_back(e.decode_pick(*st, out.back(), logits));
  e.end_pick();
  return out;
}

SamplingParams warm(uint64_t seed) {
  SamplingParams sp;
  sp.temperature = 1.3f;  // flat enough on the tiny model that the draws matter
  sp.top_p = 0.97f;
  sp.seed = seed;
  sp.logit_bias = {{5, 2.0f}, {17, -1.0f}};
  return sp;
}

// With every penalty: they count the prompt (repetition) and the tokens fed back.
SamplingParams penalised(uint64_t seed) {
  SamplingParams sp = warm(seed);
  sp.presence_penalty = 0.8f;
  sp.frequency_penalty = 0.5f;
  sp.repetition_penalty = 1.3f;
  return sp;
}

TEST(EnginePick, EveryWayOfPickingFollowsTheDrawStream) {
  auto w = tiny_weights();
  const auto prompt = prompt_of(8, 6);
  const int n = 24;
  for (uint64_t seed : {1ull, 99ull, 5ull}) {
    const SamplingParams sp = seed == 5 ? penalised(seed) : warm(seed);
    const auto want = reference_picks(w, sp, prompt, n);
    // On the host (the CPU backend picks nothing).
    Engine host(make_cpu_backend(1), w, opts(false));
    EXPECT_EQ(engine_picks(host, sp, prompt, n), want) << "seed " << seed;
    EXPECT_EQ(host.device_picks(), 0);
    // By the backend, inside recorded steps, with every third pick given back to the host.
    auto rb = std::make_unique<ReplayingBackend>();
    rb->picks = true;
    rb->give_up_every = 3;
    ReplayingBackend* fake = rb.get();
    Engine dev(std::move(rb), w, opts(true));
    EXPECT_EQ(engine_picks(dev, sp, prompt, n), want) << "seed " << seed;
    EXPECT_EQ(fake->device_picks, n - 1);
    EXPECT_EQ(dev.device_picks(), n - 1 - (n - 1) / 3);
    EXPECT_EQ(dev.host_picks(), 1 + (n - 1) / 3);
    EXPECT_GT(fake->replays, 0);
  }
  // Another seed, another stream (the tokens differ somewhere in 24 warm draws); the penalties change them too.
  EXPECT_NE(reference_picks(w, warm(1), prompt, n), reference_picks(w, warm(99), prompt, n));
  EXPECT_NE(reference_picks(w, warm(5), prompt, n), reference_picks(w, penalised(5), prompt, n));
}

TEST(EnginePick, PlainDecodeBetweenPicksGetsLogits) {
  // decode() during a picking request (the backend then stops picking) still returns the step's logits.
  auto w = tiny_weights();
  auto rb = std::make_unique<ReplayingBackend>();
  rb->picks = true;
  ReplayingBackend* fake = rb.get();
  Engine dev(std::move(rb), w, opts(true));
  Engine ref(make_cpu_backend(1), w, opts(false));
  auto a = dev.new_state();
  auto b = ref.new_state();
  std::vector<float> la, lb;
  ASSERT_TRUE(dev.prefill(*a, prompt_of(5, 7), la));
  ASSERT_TRUE(ref.prefill(*b, prompt_of(5, 7), lb));
  dev.begin_pick(warm(3));
  const int32_t t = dev.decode_pick(*a, 11, la);
  ref.decode(*b, 11, lb);
  dev.decode(*a, t, la);
  ref.decode(*b, t, lb);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(fake->device_picks, 1);  // the plain step picked nothing
  dev.end_pick();
}

TEST(EnginePick, ServesOnlyWhatTheRuleCovers) {
  SamplingParams p = penalised(1);
  EXPECT_TRUE(Engine::can_pick(p));
  p.top_k = kPickMaxTopK;
  EXPECT_TRUE(Engine::can_pick(p));
  p.top_k = kPickMaxTopK + 1;
  EXPECT_FALSE(Engine::can_pick(p));
  p = {};
  p.logit_bias.assign(size_t(kPickMaxBias) + 1, {1, 1.0f});
  EXPECT_FALSE(Engine::can_pick(p));
}

}  // namespace
}  // namespace fern
