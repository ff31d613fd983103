// fern eval's reference files (reference_logits.h): every field checked before it is used, so that a truncated or
// hand-edited file is a named error, never an exception from the JSON library or a read past the logits.
#include "engine/reference_logits.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fern {
namespace {

// The token ids of case c's key `key`: an array of integers in [0, vocab).
std::vector<int32_t> ids_of(const nlohmann::json& c, const char* key, size_t ci, int64_t vocab,
                            const std::string& name) {
  const auto it = c.find(key);
  if (it == c.end() || !it->is_array()) fail("{}.json: cases[{}].{}: expected an array of token ids", name, ci, key);
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
      fail("{}.json: cases[{}].{}: {} is not a token id below the vocabulary size {}", name, ci, key, v.dump(), vocab);
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return out;
}

// A non-negative integer field of case c.
int64_t count_of(const nlohmann::json& c, const char* key, size_t ci, const std::string& name) {
  const auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
    fail("{}.json: cases[{}].{}: expected a non-negative integer", name, ci, key);
  return it->get<int64_t>();
}

std::string read_all(const std::string& path, const std::string& prefix, std::ios::openmode mode) {
  std::ifstream f(path, mode);
  if (!f) fail("--reference {}: cannot read {}", prefix, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<ReferenceCase> parse_reference_logits(const std::string& json_text, const std::string& blob, int64_t vocab,
                                                  const std::string& name) {
  FERN_CHECK(vocab > 0, "reference logits: vocabulary size {}", vocab);
  const nlohmann::json meta = nlohmann::json::parse(json_text, nullptr, false);
  if (meta.is_discarded() || !meta.is_object()) fail("{}.json: not a JSON object", name);
  const auto vs = meta.find("vocab_size");
  if (vs == meta.end() || !vs->is_number_integer())
    fail("{}.json: vocab_size: expected an integer (not a reference-logits file?)", name);
  if (vs->get<int64_t>() != vocab)
    fail("{}.json: vocab_size {} differs from the model's {}", name, vs->get<int64_t>(), vocab);
  const auto cases = meta.find("cases");
  if (cases == meta.end() || !cases->is_array()) fail("{}.json: cases: expected an array", name);
  if (blob.size() % (size_t(vocab) * 4) != 0)
    fail("{}.f32: {} bytes is not a whole number of rows of {} float32 logits", name, blob.size(), vocab);
  const int64_t blob_rows = int64_t(blob.size() / (size_t(vocab) * 4));
  std::vector<ReferenceCase> out;
  for (size_t ci = 0; ci < cases->size(); ++ci) {
    const nlohmann::json& c = (*cases)[ci];
    if (!c.is_object()) fail("{}.json: cases[{}]: expected an object", name, ci);
    ReferenceCase k;
    k.prompt = ids_of(c, "prompt", ci, vocab, name);
    k.generated = ids_of(c, "generated", ci, vocab, name);
    const int64_t off = count_of(c, "row_offset", ci, name), rows = count_of(c, "rows", ci, name);
    if (rows != int64_t(k.prompt.size() + k.generated.size()))
      fail("{}.json: cases[{}]: rows {} != prompt {} + generated {} tokens", name, ci, rows, k.prompt.size(),
           k.generated.size());
    if (rows == 0) fail("{}.json: cases[{}]: no tokens", name, ci);
    if (off > blob_rows || rows > blob_rows - off)
      fail("{}.f32: cases[{}] needs rows {} .. {}, the file holds {}", name, ci, off, off + rows - 1, blob_rows);
    k.logits.resize(size_t(rows * vocab));
    std::memcpy(k.logits.data(), blob.data() + size_t(off * vocab) * 4, k.logits.size() * 4);
    out.push_back(std::move(k));
  }
  if (out.empty()) fail("{}.json: no cases", name);
  return out;
}

std::vector<ReferenceCase> read_reference_logits(const std::string& prefix, int64_t vocab) {
  const std::string json_text = read_all(prefix + ".json", prefix, std::ios::in);
  const std::string blob = read_all(prefix + ".f32", prefix, std::ios::binary);
  return parse_reference_logits(json_text, blob, vocab, prefix);
}

}  // namespace fern
