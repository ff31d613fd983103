// Finds added tokens (<|im_start|>, <think>, ...) in text, leftmost first and longest at a position, the way HF's
// added vocabulary splits input before normalisation. Honours lstrip / rstrip / single_word.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace fern {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedTokenSpec> tokens);
  bool empty() const { return tokens_.empty(); }

  // Calls on_text for each non-empty stretch between tokens and on_token for each token, in order. A token that
  // would overlap one of the `literal` spans (sorted, non-overlapping) is not matched.
  void scan(std::string_view text, const std::function<void(std::string_view)>& on_text,
            const std::function<void(int32_t)>& on_token, std::span<const TextSpan> literal = {}) const;

 private:
  std::vector<AddedTokenSpec> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_;  // token indices by first byte, longest first
};

}  // namespace fern
