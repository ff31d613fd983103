// UTF-8 helpers for the tokenizer: validation with the Unicode "maximal subpart" replacement rule (the rule that
// Rust's String::from_utf8_lossy and Python's errors="replace" follow, so our decode matches HF's byte for byte),
// NFC through utf8proc, and the length of a trailing incomplete character for streaming decoders.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fern::utf8 {

enum class SeqStatus { Valid, Invalid, Incomplete };

struct Seq {
  SeqStatus status;
  size_t len;      // bytes consumed: the character (Valid), the maximal invalid subpart (Invalid, >= 1), or what
                   // is there of a character cut off by the end of the input (Incomplete)
  uint32_t cp;     // the code point when Valid
};

// Reads one character at p[0..n), n >= 1.
Seq next(const unsigned char* p, size_t n);

// True when s is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool valid(std::string_view s);

// s with every ill-formed subpart (and a cut-off last character) replaced by U+FFFD.
std::string sanitize(std::string_view s);

// Length of the longest prefix of s that does not end inside a character that later bytes could still complete
// (what a streaming decoder may emit now). Everything before it is final, valid or not.
size_t complete_prefix(std::string_view s);

// Canonical composition (NFC) of well-formed UTF-8. Returns s unchanged without calling utf8proc when every byte
// is below 0xCC (all code points below U+0300 are already NFC and none of them composes with what follows).
std::string nfc(std::string_view s);

void append(std::string& out, uint32_t cp);

}  // namespace fern::utf8
