// Which tokens of the vocabulary keep a constrained reply valid (structured output): each token's bytes run
// through a copy of the JSON matcher. The common cases are cheap: one check per distinct first byte rules out most
// of the vocabulary where the JSON expects punctuation, and inside a free string every token without a quote, a
// backslash or a control character is accepted without running the matcher.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace fern {

class ConstrainedVocab {
 public:
  // `vocab`: the model's vocabulary (rows without a token are never allowed).
  ConstrainedVocab(const Tokenizer& tok, int64_t vocab);

  std::string_view bytes(int32_t id) const;
  // Whether token `id` may come next: its bytes keep the text valid; an eos id only once the value is complete;
  // other special tokens and tokens without text never.
  bool allowed(const JsonMatcher& m, int32_t id, std::span<const int32_t> eos) const;
  // Sets the logit of every token that may not come next to -inf; returns how many may.
  size_t mask(const JsonMatcher& m, std::span<float> logits, std::span<const int32_t> eos) const;

 private:
  bool is_eos(int32_t id, std::span<const int32_t> eos) const;
  std::string text_;                 // every token's bytes, back to back
  std::vector<uint32_t> offset_;     // token i: text_[offset_[i], offset_[i + 1])
  std::vector<uint8_t> flags_;       // kSpecial, kPlain
};

}  // namespace fern
