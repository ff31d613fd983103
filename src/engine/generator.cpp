#include "engine/generator.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "engine/stop_matcher.h"
#include "engine/token_constraint.h"

namespace fern {

using Clock = std::chrono::steady_clock;

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "stop";
}

std::vector<int32_t> default_eos_ids(const ModelConfig& cfg, const Tokenizer& tok) {
  std::vector<int32_t> ids = cfg.eos_token_ids;
  for (const char* s : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = tok.token_id(s)) ids.push_back(*id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int32_t Generator::sample_constrained(Sampler& sampler, const JsonMatcher& m) {
  raw_logits_.assign(logits_.begin(), logits_.end());
  const int32_t first = sampler.sample(logits_);
  if (vocab_->allowed(m, first, opt_.eos_ids)) return first;
  // The draw would break the JSON: mask every token that would, and draw again with the same parameters. Exact for
  // greedy and for temperature alone (a rejected draw leaves the others' proportions); with top-k / top-p the
  // cut is made again among the allowed tokens.
  logits_.swap(raw_logits_);
  if (vocab_->mask(m, logits_, opt_.eos_ids) == 0) return -1;
  return sampler.sample(logits_);
}

std::vector<int64_t> chat_snapshot_points(std::span<const int32_t> prompt, const Tokenizer& tok) {
  std::vector<int64_t> pts;
  const int64_t n = static_cast<int64_t>(prompt.size());
  auto im_start = tok.token_id("<|im_start|>");
  auto nl = tok.encode("\n");
  if (im_start) {
    for (int64_t i = n; i-- > 0;) {
      if (prompt[static_cast<size_t>(i)] != *im_start) continue;
      if (i > 0) pts.push_back(i);
      if (nl.size() == 1)
        for (int64_t j = i + 1; j < n; ++j)
          if (prompt[static_cast<size_t>(j)] == nl[0]) {
            if (j + 1 < n) pts.push_back(j + 1);
            break;
          }
      break;
    }
  }
  pts.push_back(n);
  return pts;
}

Generator::Generator(Engine& engine, const Tokenizer& tok, SessionCache* cache, GeneratorOptions opt)
    : engine_(engine), tok_(tok), cache_(cache), opt_(std::move(opt)) {
  if (auto id = tok_.token_id("<|im_end|>")) im_end_ = *id;
  auto nl = tok_.encode("\n");
  if (nl.size() == 1) newline_ = nl[0];
}

Generator::~Generator() = default;

void Generator::reset() { st_tokens_.clear(); }

bool Generator::is_eos(int32_t t) const {
  return std::find(opt_.eos_ids.begin(), opt_.eos_ids.end(), t) != opt_.eos_ids.end();
}

int64_t Generator::start_from_prefix(const GenerateRequest& req) {
  const auto& p = req.prompt;
  if (!st_) st_ = engine_.new_state();
  // The working state itself, when it holds a proper prefix of the prompt (the usual case for one client's next
  // turn), needs no copy at all.
  int64_t have = 0;
  const bool same_session = req.cache_key.empty() || req.cache_key == st_key_;
  if (opt_.reuse_working_state && cache_ && same_session && !st_tokens_.empty() && st_tokens_.size() < p.size() &&
      std::equal(st_tokens_.begin(), st_tokens_.end(), p.begin()))
    have = static_cast<int64_t>(st_tokens_.size());
  if (cache_) {
    int64_t snap = cache_->peek(p, req.cache_key);
    if (snap > have) have = cache_->restore(p, req.cache_key, *st_);
  }
  if (have == 0) engine_.backend().reset_state(*st_);
  FERN_CHECK(st_->pos == have, "working state at {} for a prefix of {}", st_->pos, have);
  st_tokens_.assign(p.begin(), p.begin() + have);
  st_key_ = req.cache_key;
  return have;
}

GenerateResult Generator::generate(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                                   const std::function<bool()>& cancelled,
                                   const std::function<void(const TokenLogprob&)>& on_logprob) {
  try {
    return generate_impl(req, on_text, cancelled, on_logprob);
  } catch (...) {
    st_tokens_.clear();  // the working state may be part-way through a step: never continue from it
    throw;
  }
}

GenerateResult Generator::generate_impl(const GenerateRequest& req,
                                        const std::function<void(const std::string&)>& on_text,
                                        const std::function<bool()>& cancelled,
                                        const std::function<void(const TokenLogprob&)>& on_logprob) {
  const int64_t ctx = engine_.max_context();
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt == 0) fail("the prompt is empty");
  if (n_prompt >= ctx) fail("the prompt has {} tokens; the context holds {}", n_prompt, ctx);
  const int32_t V = static_cast<int32_t>(engine_.config().vocab_size);
  FERN_CHECK(req.top_logprobs <= 20, "top_logprobs {} (at most 20)", req.top_logprobs);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= V) fail("prompt token id {} is outside the model's vocabulary ({})", t, V);

  GenerateResult res;
  res.prompt_tokens = n_prompt;
  const auto t0 = Clock::now();
  auto is_cancelled = [&] { return cancelled && cancelled(); };

  int64_t have = start_from_prefix(req);
  res.cached_tokens = have;
  // Prefill in segments that end at the snapshot positions, so that each snapshot holds exactly those tokens. The
  // cuts are made with no cache too: the chunked Gated DeltaNet rounds differently at other split points, and the
  // same splits keep the logits of a cached and an uncached run identical.
  std::vector<int64_t> cuts;
  for (int64_t p : req.snapshot_at)
    if (p > have && p <= n_prompt) cuts.push_back(p);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  if (cuts.empty() || cuts.back() != n_prompt) cuts.push_back(n_prompt);
  for (int64_t cut : cuts) {
    std::span<const int32_t> part(req.prompt.data() + have, static_cast<size_t>(cut - have));
    bool ok = engine_.prefill(*st_, part, logits_, cancelled);
    st_tokens_.insert(st_tokens_.end(), req.prompt.begin() + have, req.prompt.begin() + st_->pos);
    if (!ok) {
      res.finish = FinishReason::Cancelled;
      return res;
    }
    have = cut;
    if (cache_ && std::find(req.snapshot_at.begin(), req.snapshot_at.end(), cut) != req.snapshot_at.end())
      cache_->insert(std::span(req.prompt.data(), static_cast<size_t>(cut)), req.cache_key, *st_);
  }
  const auto t_prefill = Clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t_prefill - t0).count();

  const int64_t room = ctx - n_prompt;
  const int64_t max_new = req.max_tokens > 0 ? std::min(req.max_tokens, room) : room;
  // The plain case (no log-probabilities, no constraint, no forced tokens) lets the engine pick the tokens: where
  // the backend picks them, the logits never come to the host. Otherwise this Sampler picks from the logits.
  const bool engine_picks =
      req.top_logprobs < 0 && !req.json_schema && req.forced.empty() && Engine::can_pick(req.sampling);
  Sampler sampler(req.sampling);
  if (!engine_picks) sampler.set_prompt(req.prompt);  // the engine's picks keep their own penalty state
  std::unique_ptr<JsonMatcher> matcher;
  if (req.json_schema) {
    if (!vocab_) vocab_ = std::make_unique<ConstrainedVocab>(tok_, engine_.config().vocab_size);
    matcher = std::make_unique<JsonMatcher>(req.json_schema, req.json_allows_tool_call);
  }
  IncrementalDecoder dec(tok_, /*skip_special=*/true);
  StopMatcher stops(req.stop);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };

  struct PickScope {
    Engine* e = nullptr;
    ~PickScope() {
      if (e) e->end_pick();
    }
  } pick_scope;
  if (engine_picks) {
    engine_.begin_pick(req.sampling, req.prompt);
    pick_scope.e = &engine_;
  }
  int32_t next = -1;  // the token the engine picked in the last decode step

  res.finish = FinishReason::Length;
  bool ended_with_im_end = false;
  while (true) {
    if (is_cancelled()) {
      res.finish = FinishReason::Cancelled;
      break;
    }
    int32_t tok;
    const size_t i = res.output.size();
    // Log-probabilities from the raw logits, before the sampler scales them in place.
    if (req.top_logprobs >= 0) logprobs_.compute(logits_, req.top_logprobs);
    if (i < req.forced.size()) {
      tok = req.forced[i];
    } else if (!req.forced.empty() && !req.forced_is_prefix) {
      tok = opt_.eos_ids.empty() ? 0 : opt_.eos_ids.front();
    } else if (matcher) {
      tok = sample_constrained(sampler, *matcher);
      if (tok < 0) {  // nothing may follow (the value is whole and the eos tokens are ignored): end here
        res.finish = FinishReason::Stop;
        break;
      }
    } else if (engine_picks) {
      tok = next >= 0 ? next : engine_.pick_host(logits_);
    } else {
      tok = sampler.sample(logits_);
    }
    // Forced tokens are not checked; if one breaks the JSON, the rest of the reply is not constrained either.
    if (matcher && !is_eos(tok) && !matcher->feed(vocab_->bytes(tok))) matcher.reset();
    if (res.output.empty()) res.ttft_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    res.output.push_back(tok);
    res.completion_tokens++;
    if (!engine_picks) sampler.accept(tok);
    if (!req.ignore_eos && is_eos(tok)) {
      res.finish = FinishReason::Stop;
      ended_with_im_end = tok == im_end_;
      break;
    }
    if (req.top_logprobs >= 0) {
      res.logprobs.push_back(logprobs_.entry(tok));
      if (on_logprob) on_logprob(res.logprobs.back());
    }
    auto r = stops.push(dec.push(tok));
    emit(r.text);
    if (r.stopped) {
      res.finish = FinishReason::Stop;
      res.stop_sequence = stops.matched();
      break;
    }
    if (res.completion_tokens >= max_new) break;  // Length
    if (!req.forced.empty() && !req.forced_is_prefix && i + 1 >= req.forced.size() && opt_.eos_ids.empty()) break;
    if (engine_picks)
      next = engine_.decode_pick(*st_, tok, logits_);
    else
      engine_.decode(*st_, tok, logits_);
    st_tokens_.push_back(tok);
  }
  if (!stops.stopped()) {
    // The decoder still holds only the bytes of a character that max_tokens (or an eos) cut off; they are dropped
    // rather than flushed as U+FFFD, so the output ends with whole characters.
    emit(stops.flush());
  }

  // Snapshot of the whole conversation after the reply, as the next turn will render it ("...<|im_end|>\n").
  if (cache_ && req.snapshot_reply && ended_with_im_end && newline_ >= 0 && !is_cancelled() &&
      st_->pos + 2 < ctx) {
    const int32_t tail[2] = {im_end_, newline_};
    engine_.prefill(*st_, std::span<const int32_t>(tail, 2), logits_);
    st_tokens_.push_back(im_end_);
    st_tokens_.push_back(newline_);
    cache_->insert(st_tokens_, req.cache_key, *st_);
  }
  res.decode_seconds = std::chrono::duration<double>(Clock::now() - t_prefill).count();
  return res;
}

}  // namespace fern
