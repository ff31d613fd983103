#include "tokenizer/utf8.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace fern::utf8 {

Seq next(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {SeqStatus::Valid, 1, b0};
  int need;
  uint32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {SeqStatus::Invalid, 1, 0};
  }
  size_t i = 1;
  for (int k = 0; k < need; ++k, ++i) {
    if (i >= n) return {SeqStatus::Incomplete, i, 0};
    const unsigned char b = p[i];
    const unsigned char l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (b < l || b > h) return {SeqStatus::Invalid, i, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {SeqStatus::Valid, i, cp};
}

bool valid(std::string_view s) {
  auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Seq q = next(p + i, n - i);
    if (q.status != SeqStatus::Valid) return false;
    i += q.len;
  }
  return true;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string sanitize(std::string_view s) {
  auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  std::string out;
  out.reserve(n);
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(char(p[i++]));
      continue;
    }
    Seq q = next(p + i, n - i);
    if (q.status == SeqStatus::Valid)
      out.append(s.substr(i, q.len));
    else
      out.append("\xEF\xBF\xBD");
    i += q.len;
  }
  return out;
}

size_t complete_prefix(std::string_view s) {
  auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  // A character is at most 4 bytes, so only a start among the last 3 bytes can be cut off.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    if (p[i] < 0x80) return n;  // an ASCII byte ends everything before it
    if (p[i] >= 0xC0) {         // a lead byte: does the rest form a valid but unfinished character?
      Seq q = next(p + i, back);
      return q.status == SeqStatus::Incomplete ? i : n;
    }
  }
  return n;
}

std::string nfc(std::string_view s) {
  bool plain = true;
  for (unsigned char c : s)
    if (c >= 0xCC) {
      plain = false;
      break;
    }
  if (plain) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                      &out, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) fail("NFC normalisation failed: {}", utf8proc_errmsg(len));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), size_t(len));
}

}  // namespace fern::utf8
