#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_splitter.h"

#include <pcre2.h>

#include "core/error.h"

namespace fern {

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string source;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, const std::string& source)
    : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: pre-tokenizer regex does not compile at offset {}: {}", source, off, reinterpret_cast<char*>(msg));
  }
  // JIT is an optimisation only: without it (an unsupported CPU, a sanitizer build) the interpreter gives the same
  // matches.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  struct MatchData {
    pcre2_match_data* md;
    ~MatchData() { pcre2_match_data_free(md); }
  } md{pcre2_match_data_create(1, nullptr)};
  if (!md.md) throw std::bad_alloc();
  auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0, last = 0;
  while (pos < n) {
    // NO_UTF_CHECK: callers pass well-formed UTF-8 (the tokenizer sanitises its input first).
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md.md, nullptr)
                        : pcre2_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md.md, nullptr);
    // The JIT's stack is small and fixed; the interpreter keeps its backtracking state on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("{}: pre-tokenizer regex failed at byte {}: {}", impl_->source, pos, reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
    size_t s = ov[0], e = ov[1];
    if (e == s) {  // an empty match: step over one character and try again
      pos = s + 1;
      while (pos < n && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > last) out.push_back(text.substr(last, s - last));
    out.push_back(text.substr(s, e - s));
    last = pos = e;
  }
  if (last < n) out.push_back(text.substr(last));
}

}  // namespace fern
