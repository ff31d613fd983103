#include "tokenizer/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/utf8.h"

namespace fern {
namespace {

bool is_space_cp(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
  if (cp < 0x80) return false;
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_word_cp(uint32_t cp) {
  if (cp == '_') return true;
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// Code point that ends just before `end` (text is well-formed).
uint32_t cp_before(std::string_view text, size_t end, size_t* start) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  *start = i;
  return utf8::next(reinterpret_cast<const unsigned char*>(text.data()) + i, end - i).cp;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenSpec> tokens) : tokens_(std::move(tokens)) {
  for (uint32_t i = 0; i < tokens_.size(); ++i) by_first_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  for (auto& v : by_first_)
    std::stable_sort(v.begin(), v.end(),
                     [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

void AddedTokenMatcher::scan(std::string_view text, const std::function<void(std::string_view)>& on_text,
                             const std::function<void(int32_t)>& on_token, std::span<const TextSpan> literal) const {
  auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t frag = 0, i = 0, span = 0;
  while (i < n) {
    const auto& cands = by_first_[p[i]];
    const AddedTokenSpec* hit = nullptr;
    while (span < literal.size() && literal[span].end <= i) ++span;  // spans that end before i are behind us
    for (uint32_t k : cands) {
      const AddedTokenSpec& t = tokens_[k];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (span < literal.size() && literal[span].begin < i + t.content.size()) continue;  // overlaps request text
      if (t.single_word) {  // must not be glued to a word character on either side
        size_t s;
        if (i > 0 && is_word_cp(cp_before(text, i, &s))) continue;
        const size_t e = i + t.content.size();
        if (e < n && is_word_cp(utf8::next(p + e, n - e).cp)) continue;
      }
      hit = &t;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t left_end = i;
    if (hit->lstrip) {
      size_t s;
      while (left_end > frag && is_space_cp(cp_before(text, left_end, &s))) left_end = s;
    }
    if (left_end > frag) on_text(text.substr(frag, left_end - frag));
    on_token(hit->id);
    i += hit->content.size();
    if (hit->rstrip) {
      while (i < n) {
        utf8::Seq q = utf8::next(p + i, n - i);
        if (!is_space_cp(q.cp)) break;
        i += q.len;
      }
    }
    frag = i;
  }
  if (frag < n) on_text(text.substr(frag));
}

}  // namespace fern
