// `fern eval`: teacher-forced consistency of a backend against reference logits, either from another fern backend
// on the same weights (default: the CPU backend) or from a file written by tools/golden/hf_golden.py (HF
// transformers on the same, dequantized weights). Reports top-1 agreement, logits NMSE, the perplexity of the
// reference tokens under both, their relative difference, and the mean KL(reference || tested).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "cli/command.h"
#include "cli/setup.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/reference_logits.h"

namespace fern::cli {
namespace {

struct Options {
  ModelSource source;
  std::string backend = "auto";
  std::string reference = "cpu";     // cpu | a path prefix of hf_golden.py output (PREFIX.json + PREFIX.f32)
  int64_t positions = 256;           // teacher-forced positions when the reference is a backend
  int64_t prompt_len = 16;
  int threads = 0;
  std::string json_path;
  double min_top1 = 0, max_ppl_rel = -1;  // optional pass/fail thresholds (exit code 2 when missed)
};

struct Case {
  std::vector<int32_t> tokens;  // teacher-forced input; logits row t predicts tokens[t + 1]
  std::vector<float> ref;       // [tokens.size(), V]
  // Perplexity and KL score the positions t >= score_from, whose next token is the reference's greedy choice
  // (the random prompt tokens before them would only measure how flat random logits are).
  size_t score_from = 0;
};

struct Metrics {
  int64_t rows = 0, top1 = 0, scored = 0;
  double err2 = 0, ref2 = 0, nll_ref = 0, nll_test = 0, kl = 0;
};

// log-softmax of one row into `out`.
void log_softmax(const float* x, int64_t V, std::vector<double>& out) {
  out.resize(static_cast<size_t>(V));
  double m = x[0];
  for (int64_t j = 1; j < V; ++j) m = std::max(m, double(x[j]));
  double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(double(x[j]) - m);
  const double lse = m + std::log(s);
  for (int64_t j = 0; j < V; ++j) out[size_t(j)] = double(x[j]) - lse;
}

void accumulate(const float* test, const float* ref, int64_t V, int32_t next_token, Metrics& m) {
  int64_t at = 0, ar = 0;
  for (int64_t j = 0; j < V; ++j) {
    const double d = double(test[j]) - double(ref[j]);
    m.err2 += d * d;
    m.ref2 += double(ref[j]) * double(ref[j]);
    if (test[j] > test[at]) at = j;
    if (ref[j] > ref[ar]) ar = j;
  }
  m.rows += 1;
  m.top1 += (at == ar);
  if (next_token < 0) return;
  static thread_local std::vector<double> lt, lr;
  log_softmax(test, V, lt);
  log_softmax(ref, V, lr);
  double kl = 0;
  for (int64_t j = 0; j < V; ++j) kl += std::exp(lr[size_t(j)]) * (lr[size_t(j)] - lt[size_t(j)]);
  m.kl += kl;
  m.nll_ref -= lr[size_t(next_token)];
  m.nll_test -= lt[size_t(next_token)];
  m.scored += 1;
}

std::vector<Case> cases_from_file(const std::string& prefix, int64_t V) {
  std::vector<Case> out;
  for (ReferenceCase& r : read_reference_logits(prefix, V)) {
    Case k;
    k.tokens = std::move(r.prompt);
    k.score_from = k.tokens.empty() ? 0 : k.tokens.size() - 1;
    k.tokens.insert(k.tokens.end(), r.generated.begin(), r.generated.end());
    k.ref = std::move(r.logits);
    out.push_back(std::move(k));
  }
  return out;
}

int run_eval(const Options& o) {
  auto weights = o.source.load();
  const int64_t V = weights->config.vocab_size;
  std::vector<Case> cases;
  std::string ref_name;
  if (o.reference == "cpu" || o.reference == "cuda") {
    // A greedy continuation under the reference backend, so the scored tokens are ones the model finds likely.
    Engine ref(make_backend(o.reference, o.threads), weights);
    ref_name = ref.backend().name();
    std::mt19937 rng(11);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(std::min<int64_t>(V, 151000) - 1));
    Case k;
    for (int64_t i = 0; i < o.prompt_len; ++i) k.tokens.push_back(tok(rng));
    k.score_from = k.tokens.size() - 1;
    auto st = ref.new_state(o.positions + o.prompt_len + 2);
    std::vector<float> logits;
    ref.prefill(*st, k.tokens, logits);
    while (int64_t(k.tokens.size()) < o.positions) {
      int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      k.tokens.push_back(next);
      ref.decode(*st, next, logits);
    }
    auto st2 = ref.new_state(o.positions + 2);
    ref.logits_all(*st2, k.tokens, k.ref);
    cases.push_back(std::move(k));
  } else {
    cases = cases_from_file(o.reference, V);
    ref_name = "file:" + o.reference;
  }
  Engine test(make_backend(o.backend, o.threads), weights);
  Metrics m;
  for (const Case& k : cases) {
    auto st = test.new_state(int64_t(k.tokens.size()) + 2);
    std::vector<float> logits;
    test.logits_all(*st, k.tokens, logits);
    for (size_t t = 0; t < k.tokens.size(); ++t) {
      const int32_t next = t + 1 < k.tokens.size() && t >= k.score_from ? k.tokens[t + 1] : -1;
      accumulate(logits.data() + t * size_t(V), k.ref.data() + t * size_t(V), V, next, m);
    }
  }
  const double ppl_ref = std::exp(m.nll_ref / double(std::max<int64_t>(1, m.scored)));
  const double ppl_test = std::exp(m.nll_test / double(std::max<int64_t>(1, m.scored)));
  const double rel = (ppl_test - ppl_ref) / ppl_ref;
  const double top1 = double(m.top1) / double(std::max<int64_t>(1, m.rows));
  const double nmse = m.ref2 > 0 ? m.err2 / m.ref2 : m.err2;
  std::printf("reference %s vs %s on %s: %lld positions\n", ref_name.c_str(), test.backend().name().c_str(),
              o.source.describe().c_str(), static_cast<long long>(m.rows));
  std::printf("top-1 agreement %.2f%% | logits NMSE %.3g | perplexity ref %.4f test %.4f (rel %+.4f%%) | mean KL %.3g\n",
              100.0 * top1, nmse, ppl_ref, ppl_test, 100.0 * rel, m.kl / double(std::max<int64_t>(1, m.scored)));
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"reference", ref_name}, {"backend", test.backend().name()}, {"model", o.source.describe()},
                        {"positions", m.rows}, {"top1_agreement", top1}, {"logits_nmse", nmse},
                        {"ppl_reference", ppl_ref}, {"ppl_test", ppl_test}, {"ppl_rel_diff", rel},
                        {"mean_kl", m.kl / double(std::max<int64_t>(1, m.scored))}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  bool ok = top1 >= o.min_top1 && (o.max_ppl_rel < 0 || std::fabs(rel) <= o.max_ppl_rel);
  return ok ? 0 : 2;
}

Command reg("eval", "Teacher-forced consistency of a backend against reference logits", [](CLI::App& app) -> RunFn {
  auto o = std::make_shared<Options>();
  o->source.add_options(app);
  app.add_option("--backend", o->backend, "Backend under test: auto | cpu | cuda");
  app.add_option("--reference", o->reference,
                 "cpu | cuda (another backend on the same weights) or PREFIX of hf_golden.py output");
  app.add_option("--positions", o->positions, "Teacher-forced positions (backend reference)")->check(CLI::Range(2, 1 << 20));
  app.add_option("--prompt-len", o->prompt_len, "Random prompt tokens before the greedy continuation");
  app.add_option("--threads", o->threads, "CPU threads (0 = all)");
  app.add_option("--json", o->json_path, "Write the metrics as JSON");
  app.add_option("--min-top1", o->min_top1, "Fail (exit 2) below this top-1 agreement (0..1)");
  app.add_option("--max-ppl-rel", o->max_ppl_rel, "Fail (exit 2) above this |relative perplexity difference|");
  return [o] { return run_eval(*o); };
});

}  // namespace
}  // namespace fern::cli
