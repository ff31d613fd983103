// Tokenizer: added tokens first, then NFC, the Split regex(es), and BPE on each piece (MODEL.md 4.1).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/regex_splitter.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace fern {
namespace {

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const TokenizerSpec& spec) : model_(spec), nfc_(spec.nfc) {
    for (auto& s : spec.splits) splitters_.push_back(std::make_unique<RegexSplitter>(s.pattern, s.literal, spec.source));
    std::vector<AddedTokenSpec> raw, normalized;
    max_id_ = model_.max_id();
    for (auto& a : spec.added) {
      (a.normalized && nfc_ ? normalized : raw).push_back(a);
      max_id_ = std::max(max_id_, a.id);
    }
    if (size_t(max_id_) > size_t(model_.max_id()) + spec.added.size() + 1024)
      fail("{}: added_tokens: ids up to {} far beyond the vocabulary ({})", spec.source, max_id_, model_.max_id());
    added_.resize(size_t(max_id_) + 1 - size_t(model_.max_id() + 1));
    for (auto& a : spec.added) {
      added_by_content_[a.content] = a.id;
      if (a.id > model_.max_id()) {
        added_[size_t(a.id - model_.max_id() - 1)] = Added{a.content, a.special, true};
      } else {
        overrides_[a.id] = Added{a.content, a.special, true};
      }
    }
    raw_matcher_ = AddedTokenMatcher(std::move(raw));
    norm_matcher_ = AddedTokenMatcher(std::move(normalized));
  }

  std::vector<int32_t> encode(std::string_view text) const override { return encode_impl(text, true, {}); }
  std::vector<int32_t> encode_literal(std::string_view text) const override { return encode_impl(text, false, {}); }
  std::vector<int32_t> encode_marked(std::string_view text, std::span<const TextSpan> literal) const override {
    for (size_t k = 0; k < literal.size(); ++k)
      if (literal[k].begin > literal[k].end || literal[k].end > text.size() ||
          (k > 0 && literal[k].begin < literal[k - 1].end))
        fail("encode_marked: literal span {} [{}, {}) is out of order or outside the text ({} bytes)", k,
             literal[k].begin, literal[k].end, text.size());
    return encode_impl(text, true, literal);
  }

  std::vector<int32_t> encode_impl(std::string_view text, bool match_added, std::span<const TextSpan> literal) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::string clean;
    if (!utf8::valid(text)) {  // bytes from outside JSON (CLI, fuzzing): ill-formed parts become U+FFFD
      if (!literal.empty()) fail("encode_marked: text is not valid UTF-8");  // offsets would shift
      clean = utf8::sanitize(text);
      text = clean;
    }
    std::vector<std::string_view> pieces;
    auto on_token = [&](int32_t id) { out.push_back(id); };
    auto encode_normalized = [&](std::string_view frag) {
      pieces.clear();
      split(frag, pieces);
      for (auto p : pieces) model_.encode_piece(p, out);
    };
    auto overlaps_literal = [&](std::string_view frag) {
      const size_t b = size_t(frag.data() - text.data()), e = b + frag.size();
      for (const auto& s : literal)
        if (s.begin < e && b < s.end) return true;
      return false;
    };
    auto normalize_then_encode = [&](std::string_view frag) {
      if (!nfc_) return encode_normalized(frag);
      const std::string n = utf8::nfc(frag);
      // Tokens matched after normalisation: not in request text (NFC moves offsets, so the whole stretch counts).
      if (norm_matcher_.empty() || !match_added || (!literal.empty() && overlaps_literal(frag)))
        return encode_normalized(n);
      norm_matcher_.scan(n, encode_normalized, on_token);
    };
    if (match_added)
      raw_matcher_.scan(text, normalize_then_encode, on_token, literal);
    else
      normalize_then_encode(text);
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (const Added* a = added(id)) {
        if (!(skip_special && a->special)) bytes += a->content;
      } else {
        bytes += model_.bytes_of(id);
      }
    }
    return utf8::valid(bytes) ? bytes : utf8::sanitize(bytes);
  }

  std::optional<int32_t> token_id(std::string_view token) const override {
    auto it = added_by_content_.find(std::string(token));
    if (it != added_by_content_.end()) return it->second;
    const int32_t id = model_.id_of_text(token);
    if (id >= 0) return id;
    return std::nullopt;
  }

  std::string token_text(int32_t id) const override {
    if (const Added* a = added(id)) return a->content;
    return model_.bytes_of(id);
  }

  bool is_special(int32_t id) const override {
    const Added* a = added(id);
    return a && a->special;
  }

  int32_t vocab_size() const override { return max_id_ + 1; }

 private:
  struct Added {
    std::string content;
    bool special = false, present = false;
  };

  const Added* added(int32_t id) const {
    if (id > model_.max_id() && id <= max_id_) {
      const Added& a = added_[size_t(id - model_.max_id() - 1)];
      return a.present ? &a : nullptr;
    }
    if (!overrides_.empty()) {
      auto it = overrides_.find(id);
      if (it != overrides_.end()) return &it->second;
    }
    return nullptr;
  }

  void split(std::string_view text, std::vector<std::string_view>& out) const {
    if (splitters_.empty()) {
      out.push_back(text);
      return;
    }
    splitters_[0]->split(text, out);
    for (size_t k = 1; k < splitters_.size(); ++k) {
      std::vector<std::string_view> next;
      for (auto p : out) splitters_[k]->split(p, next);
      out.swap(next);
    }
  }

  BpeModel model_;
  bool nfc_;
  int32_t max_id_ = -1;
  std::vector<std::unique_ptr<RegexSplitter>> splitters_;
  AddedTokenMatcher raw_matcher_, norm_matcher_;
  std::vector<Added> added_;                          // ids above the vocabulary
  std::unordered_map<int32_t, Added> overrides_;     // added tokens that reuse a vocabulary id
  std::unordered_map<std::string, int32_t> added_by_content_;
};

std::string read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot open tokenizer file", path);
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  if (size_t(st.st_size) > kMaxTokenizerFileBytes)
    fail("{}: {} bytes exceed the tokenizer file limit of {} bytes", path, st.st_size, kMaxTokenizerFileBytes);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open tokenizer file", path);
  std::string s(size_t(st.st_size), '\0');
  f.read(s.data(), std::streamsize(s.size()));
  if (size_t(f.gcount()) != s.size()) fail("{}: short read", path);
  return s;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  return std::make_unique<BpeTokenizer>(parse_tokenizer_json(json_text, source));
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::string file = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/tokenizer.json";
  return from_json(read_file(file), file);
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_text(id);
  const size_t n = utf8::complete_prefix(pending_);
  if (n == 0) return {};
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace fern
