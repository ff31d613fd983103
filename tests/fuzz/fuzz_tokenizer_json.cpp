// libFuzzer target: tokenizer.json loading from arbitrary bytes. A bad file must be a fern::Error; any other
// exception or a crash is a bug. A file that loads must encode and decode a fixed sample.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto t = fern::Tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    auto ids = t->encode("Hello, world! 123 <s> \xC3\xA9");
    (void)t->decode(ids);
  } catch (const fern::Error&) {
  }
  return 0;
}
