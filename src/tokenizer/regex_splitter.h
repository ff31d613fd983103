// The Split pre-tokenizer with "Isolated" behaviour: every regex match becomes a piece, and so does any text
// between matches. PCRE2 with UTF + UCP (Unicode properties for \p{..}, \s and case folding), JIT-compiled when
// the library supports it. Thread-safe: each call uses its own match data.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fern {

class RegexSplitter {
 public:
  // Throws fern::Error naming `source` when the pattern does not compile.
  RegexSplitter(const std::string& pattern, bool literal, const std::string& source);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` (well-formed UTF-8) to `out` as views into `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fern
