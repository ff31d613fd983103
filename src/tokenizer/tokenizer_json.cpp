#include "tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <unordered_set>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace fern {
namespace {

using json = nlohmann::json;

// The GPT-2 pattern that a ByteLevel pre-tokenizer with use_regex=true applies.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rejects nesting deeper than kMaxJsonDepth before parsing, so that no recursive walk of the parsed value (dump,
// copy, destruction) can overflow the stack.
void check_depth(std::string_view text, const std::string& source) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) fail("{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

const json& member(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail("{}: missing key \"{}\"", where, key);
  return *it;
}

bool get_bool(const json& obj, const char* key, bool dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail("{}: \"{}\" must be a boolean", where, key);
  return it->get<bool>();
}

std::string type_of(const json& obj, const std::string& where) {
  if (!obj.is_object()) fail("{}: must be an object", where);
  const json& t = member(obj, "type", where);
  if (!t.is_string()) fail("{}: \"type\" must be a string", where);
  return t.get<std::string>();
}

int32_t get_id(const json& v, const std::string& where) {
  if (!v.is_number_integer()) fail("{}: id must be an integer", where);
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId) fail("{}: id {} out of range [0, {})", where, id, kMaxTokenId);
  return int32_t(id);
}

void parse_normalizer(const json& n, TokenizerSpec& spec, const std::string& where) {
  if (n.is_null()) return;
  const std::string t = type_of(n, where);
  if (t == "NFC") {
    spec.nfc = true;
  } else if (t == "Sequence") {
    const json& list = member(n, "normalizers", where);
    if (!list.is_array()) fail("{}.normalizers: must be an array", where);
    for (size_t i = 0; i < list.size(); ++i) parse_normalizer(list[i], spec, fmt::format("{}.normalizers[{}]", where, i));
  } else {
    fail("{}: unsupported normalizer type \"{}\" (supported: NFC)", where, t);
  }
}

void parse_pre_tokenizer(const json& p, TokenizerSpec& spec, const std::string& where) {
  if (p.is_null()) return;
  const std::string t = type_of(p, where);
  if (t == "Sequence") {
    const json& list = member(p, "pretokenizers", where);
    if (!list.is_array()) fail("{}.pretokenizers: must be an array", where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(list[i], spec, fmt::format("{}.pretokenizers[{}]", where, i));
  } else if (t == "Split") {
    const json& pat = member(p, "pattern", where);
    if (!pat.is_object()) fail("{}.pattern: must be an object", where);
    SplitSpec s;
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      s.pattern = pat["Regex"].get<std::string>();
    } else if (pat.contains("String") && pat["String"].is_string()) {
      s.pattern = pat["String"].get<std::string>();
      s.literal = true;
    } else {
      fail("{}.pattern: needs a \"Regex\" or \"String\" string", where);
    }
    if (s.pattern.empty()) fail("{}.pattern: empty", where);
    const json& b = member(p, "behavior", where);
    if (!b.is_string() || b.get<std::string>() != "Isolated")
      fail("{}.behavior: only \"Isolated\" is supported", where);
    if (get_bool(p, "invert", false, where)) fail("{}.invert: true is not supported", where);
    spec.splits.push_back(std::move(s));
  } else if (t == "ByteLevel") {
    if (get_bool(p, "add_prefix_space", false, where)) fail("{}.add_prefix_space: true is not supported", where);
    if (get_bool(p, "use_regex", true, where)) spec.splits.push_back({kGpt2Pattern, false});
  } else {
    fail("{}: unsupported pre-tokenizer type \"{}\" (supported: Sequence, Split, ByteLevel)", where, t);
  }
}

void parse_model(const json& m, TokenizerSpec& spec, const std::string& where) {
  const std::string t = type_of(m, where);
  if (t != "BPE") fail("{}.type: \"{}\" is not supported (only byte-level \"BPE\")", where, t);
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    fail("{}.dropout: BPE dropout is not supported", where);
  if (get_bool(m, "byte_fallback", false, where)) fail("{}.byte_fallback: true is not supported", where);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(k);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      fail("{}.{}: must be empty for byte-level BPE", where, k);
  }
  spec.ignore_merges = get_bool(m, "ignore_merges", false, where);

  const json& vocab = member(m, "vocab", where);
  if (!vocab.is_object()) fail("{}.vocab: must be an object of token -> id", where);
  spec.vocab.reserve(vocab.size());
  std::unordered_set<int32_t> ids;
  ids.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string w = fmt::format("{}.vocab[\"{}\"]", where, it.key());
    if (it.key().empty()) fail("{}: empty token", w);
    const int32_t id = get_id(it.value(), w);
    if (!ids.insert(id).second) fail("{}: duplicate id {}", w, id);
    spec.vocab.emplace_back(it.key(), id);
  }

  const json& merges = member(m, "merges", where);
  if (!merges.is_array()) fail("{}.merges: must be an array", where);
  if (merges.size() > kMaxMerges) fail("{}.merges: {} merges exceed the limit of {}", where, merges.size(), kMaxMerges);
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    if (e.is_string()) {  // "a b"
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
        fail("{}.merges[{}]: \"{}\" is not two tokens separated by one space", where, i, s);
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      fail("{}.merges[{}]: must be \"a b\" or [\"a\", \"b\"]", where, i);
    }
  }
}

void parse_added(const json& list, TokenizerSpec& spec, const std::string& where) {
  if (list.is_null()) return;
  if (!list.is_array()) fail("{}: must be an array", where);
  std::unordered_set<int32_t> ids;
  std::unordered_set<std::string> contents;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const json& e = list[i];
    if (!e.is_object()) fail("{}: must be an object", w);
    AddedTokenSpec a;
    a.id = get_id(member(e, "id", w), w + ".id");
    const json& c = member(e, "content", w);
    if (!c.is_string() || c.get_ref<const std::string&>().empty()) fail("{}.content: must be a non-empty string", w);
    a.content = c.get<std::string>();
    if (!utf8::valid(a.content)) fail("{}.content: not valid UTF-8", w);
    a.special = get_bool(e, "special", false, w);
    a.lstrip = get_bool(e, "lstrip", false, w);
    a.rstrip = get_bool(e, "rstrip", false, w);
    a.single_word = get_bool(e, "single_word", false, w);
    a.normalized = get_bool(e, "normalized", !a.special, w);
    if (!ids.insert(a.id).second) fail("{}: duplicate added-token id {}", w, a.id);
    if (!contents.insert(a.content).second) fail("{}: duplicate added-token content \"{}\"", w, a.content);
    spec.added.push_back(std::move(a));
  }
}

}  // namespace

TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& source) {
  if (text.size() > kMaxTokenizerFileBytes)
    fail("{}: {} bytes exceed the tokenizer file limit of {} bytes", source, text.size(), kMaxTokenizerFileBytes);
  check_depth(text, source);
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("{}: not valid JSON", source);
  if (!j.is_object()) fail("{}: top level must be a JSON object", source);
  TokenizerSpec spec;
  spec.source = source;
  parse_model(member(j, "model", source), spec, source + ": model");
  parse_added(j.value("added_tokens", json()), spec, source + ": added_tokens");
  parse_normalizer(j.value("normalizer", json()), spec, source + ": normalizer");
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), spec, source + ": pre_tokenizer");
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    const std::string t = type_of(j["decoder"], source + ": decoder");
    if (t != "ByteLevel") fail("{}: decoder: unsupported type \"{}\" (supported: ByteLevel)", source, t);
  }
  return spec;
}

}  // namespace fern
