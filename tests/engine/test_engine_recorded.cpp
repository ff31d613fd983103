// Engine::decode with recorded steps, on the CPU: a backend that records a step by keeping the closure and replays
// it by running it again stands in for CUDA graphs. It checks the engine's side of the contract (the token written
// into the slot before a replay, the logits read after it, one record per state, a new record when the state
// changes, eager steps after a failed recording, FERN_DECODE_GRAPH=0), not the graphs themselves
// (tests/cuda/test_cuda_forward.cpp runs the engine on the GPU against eager steps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/synth.h"

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

 private:
  std::unique_ptr<Backend> in_ = make_cpu_backend(1);
  std::function<void()> record_;
  uint64_t serial_ = 0;
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

}  // namespace
}  // namespace fern
