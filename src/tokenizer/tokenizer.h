// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (MODEL.md section 4): added tokens matched
// literally first, NFC, the Split pre-tokenizer regex read from the file, byte-level mapping, BPE merges by rank.
// Token ids are identical to HF `tokenizers`.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fern {

// A byte range [begin, end) of a text.
struct TextSpan {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  // Loads a tokenizer.json file, or <dir>/tokenizer.json when given a directory. Throws fern::Error.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // Builds a tokenizer from the text of a tokenizer.json; `source` names it in error messages.
  static std::unique_ptr<Tokenizer> from_json(std::string_view json_text, const std::string& source);
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Like encode, but added-token strings in `text` stay ordinary text ("<|im_start|>" typed by a user becomes
  // plain BPE tokens, never a control token; HF's split_special_tokens=True). For untrusted message content.
  virtual std::vector<int32_t> encode_literal(std::string_view text) const = 0;
  // encode, except that added-token strings overlapping the `literal` spans (sorted, non-overlapping; e.g. the
  // message contents of a rendered chat, render_chat_marked) stay text. Where the spans hold no added-token
  // strings the ids equal encode(text), because normalisation and splitting still see the whole text.
  virtual std::vector<int32_t> encode_marked(std::string_view text, std::span<const TextSpan> literal) const = 0;
  // skip_special: drop added tokens whose `special` flag is set (like HF skip_special_tokens).
  // Ids without a token (negative, unused rows of the embedding) are skipped; invalid UTF-8 (a character cut
  // off at either end) becomes U+FFFD, as in HF.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // Added-token content ("<|im_end|>"), or a vocabulary entry as written in tokenizer.json ("Ġthe").
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  // Raw bytes of one token ("" for an unknown id); may be part of a UTF-8 character.
  virtual std::string token_text(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;                                     // largest id + 1
};

// Streaming decoder: feed ids one at a time, get text that never ends in half of a UTF-8 character; flush()
// returns whatever bytes remain at the end (never dropped).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace fern
