#include "engine/token_constraint.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fern {

namespace {
constexpr uint8_t kSpecial = 1;  // a special added token, or no text
constexpr uint8_t kPlain = 2;    // whole UTF-8 characters, no '"', '\\' or control bytes: free string content
}  // namespace

ConstrainedVocab::ConstrainedVocab(const Tokenizer& tok, int64_t vocab) {
  FERN_CHECK(vocab > 0, "constrained vocabulary of {} tokens", vocab);
  offset_.reserve(size_t(vocab) + 1);
  flags_.resize(size_t(vocab), 0);
  offset_.push_back(0);
  for (int64_t i = 0; i < vocab; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const bool known = id < tok.vocab_size();
    const std::string t = known ? tok.token_text(id) : std::string();
    text_ += t;
    offset_.push_back(static_cast<uint32_t>(text_.size()));
    if (t.empty() || (known && tok.is_special(id))) {
      flags_[size_t(i)] = kSpecial;
      continue;
    }
    // Plain: whole UTF-8 characters, none of them a quote, a backslash or a control character.
    bool plain = true;
    uint8_t left = 0, lo = 0x80, hi = 0xBF;
    for (unsigned char c : t)
      if (c == '"' || c == '\\' || c < 0x20 || utf8_step(left, lo, hi, c) == 0) plain = false;
    if (plain && left == 0) flags_[size_t(i)] = kPlain;
  }
}

std::string_view ConstrainedVocab::bytes(int32_t id) const {
  if (id < 0 || size_t(id) + 1 >= offset_.size()) return {};
  return std::string_view(text_).substr(offset_[size_t(id)], offset_[size_t(id) + 1] - offset_[size_t(id)]);
}

bool ConstrainedVocab::is_eos(int32_t id, std::span<const int32_t> eos) const {
  return std::find(eos.begin(), eos.end(), id) != eos.end();
}

bool ConstrainedVocab::allowed(const JsonMatcher& m, int32_t id, std::span<const int32_t> eos) const {
  if (id < 0 || size_t(id) >= flags_.size()) return false;
  if (is_eos(id, eos)) return m.complete();
  if (m.unconstrained()) return true;
  if (flags_[size_t(id)] & kSpecial) return false;
  if ((flags_[size_t(id)] & kPlain) && m.in_free_string()) return true;
  return m.accepts(bytes(id));
}

size_t ConstrainedVocab::mask(const JsonMatcher& m, std::span<float> logits, std::span<const int32_t> eos) const {
  const size_t n = std::min(logits.size(), flags_.size());
  for (size_t i = n; i < logits.size(); ++i) logits[i] = -INFINITY;
  bool first_ok[256];
  for (int b = 0; b < 256; ++b) {
    const char ch = static_cast<char>(b);
    first_ok[b] = m.unconstrained() || m.accepts(std::string_view(&ch, 1));
  }
  const bool free_string = m.in_free_string();
  const bool complete = m.complete();
  size_t left = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    bool ok;
    if (is_eos(id, eos)) {
      ok = complete;
    } else if (m.unconstrained()) {
      ok = true;
    } else if (flags_[i] & kSpecial) {
      ok = false;
    } else {
      const std::string_view b = bytes(id);
      if (!first_ok[static_cast<uint8_t>(b[0])]) ok = false;
      else if (free_string && (flags_[i] & kPlain)) ok = true;
      else ok = b.size() == 1 || m.accepts(b);
    }
    if (ok) ++left;
    else logits[i] = -INFINITY;
  }
  return left;
}

}  // namespace fern
