// The GPT-2 byte-level alphabet: every byte is shown as one printable code point so that BPE vocabularies can be
// stored as JSON text. Bytes 33..126, 161..172 and 174..255 stand for themselves; the other 68 bytes get
// U+0100.. in byte order (so " " is "Ġ" U+0120 and "\n" is "Ċ" U+010A).
#pragma once
#include <array>
#include <cstdint>

namespace fern::byte_level {

struct Tables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // -1 where the code point is not part of the alphabet
  constexpr Tables() {
    for (auto& x : cp_to_byte) x = -1;
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      byte_to_cp[size_t(b)] = self ? uint32_t(b) : extra++;
      cp_to_byte[byte_to_cp[size_t(b)]] = int16_t(b);
    }
  }
};

inline constexpr Tables kTables{};

// The byte a code point of the alphabet stands for, or -1.
constexpr int byte_of(uint32_t cp) { return cp < kTables.cp_to_byte.size() ? kTables.cp_to_byte[cp] : -1; }

}  // namespace fern::byte_level
