// Finds added tokens (<|im_start|>, <think>, ...) in text, leftmost first and longest at a position, the way HF's
// added vocabulary splits input before normalisation. Honours lstrip / rstrip / single_word.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace fern {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedTokenSpec> tokens);
  bool empty() const { return tokens_.empty(); }

  // Calls on_text for each stretch between tokens (possibly empty-free) and on_token for each token, in order.
  void scan(std::string_view text, const std::function<void(std::string_view)>& on_text,
            const std::function<void(int32_t)>& on_token) const;

 private:
  std::vector<AddedTokenSpec> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_;  // token indices by first byte, longest first
};

}  // namespace fern
