// The reference logits `fern eval --reference PREFIX` compares a backend with (tools/golden/hf_golden.py writes
// them: HF transformers on the same, dequantized weights). PREFIX.json holds {"vocab_size": V, "cases": [{"prompt":
// [ids], "generated": [ids], "row_offset": o, "rows": n}, ...]}, PREFIX.f32 the logits of every case's rows as
// little-endian float32 [rows total, V]; case c's rows o .. o + n - 1 are its prompt followed by its generated
// tokens (n = prompt + generated). A malformed pair of files is a fern::Error naming the file, the case and the key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fern {

struct ReferenceCase {
  std::vector<int32_t> prompt, generated;
  std::vector<float> logits;  // [prompt.size() + generated.size(), V]
};

// Reads PREFIX.json and PREFIX.f32 for a model of `vocab` logits.
std::vector<ReferenceCase> read_reference_logits(const std::string& prefix, int64_t vocab);
// The same from the files' contents (`name` is the prefix the errors mention).
std::vector<ReferenceCase> parse_reference_logits(const std::string& json_text, const std::string& blob, int64_t vocab,
                                                  const std::string& name);

}  // namespace fern
