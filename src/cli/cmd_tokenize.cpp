// `fern tokenize`: encode or decode with a tokenizer.json, for scripts and differential tests.
//   fern tokenize --tokenizer DIR_OR_FILE [--jsonl] [--decode] [--skip-special] [--bench]
// Plain mode encodes all of stdin and prints one JSON array of ids. --jsonl: each input line is a JSON string and
// each output line the JSON array of its ids; with --decode each input line is a JSON array of ids and each output
// line the decoded JSON string. --bench (with --jsonl) encodes every line, prints nothing per line, and reports
// single-thread throughput as one JSON object.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace fern::cli {
namespace {

struct Opts {
  std::string tokenizer;
  bool jsonl = false, decode = false, skip_special = false, bench = false;
};

std::vector<int32_t> parse_ids(const std::string& line, size_t lineno) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_array()) fail("stdin line {}: expected a JSON array of token ids", lineno);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer()) fail("stdin line {}: token ids must be integers", lineno);
    const int64_t x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) fail("stdin line {}: token id {} out of range", lineno, x);
    ids.push_back(int32_t(x));
  }
  return ids;
}

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int run(const Opts& o) {
  auto tok = Tokenizer::load(o.tokenizer);
  if (o.bench) {
    if (!o.jsonl || o.decode) fail("--bench needs --jsonl (one JSON string per line) and no --decode");
    std::vector<std::string> docs;
    std::string line;
    size_t lineno = 0, bytes = 0;
    while (std::getline(std::cin, line)) {
      ++lineno;
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_string()) fail("stdin line {}: expected a JSON string", lineno);
      docs.push_back(j.get<std::string>());
      bytes += docs.back().size();
    }
    double best = 1e30;
    size_t tokens = 0;
    for (int rep = 0; rep < 3; ++rep) {  // best of three, like the HF side (tools/tokenizer/bench_hf.py)
      auto t0 = std::chrono::steady_clock::now();
      tokens = 0;
      for (const auto& d : docs) tokens += tok->encode(d).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("{\"impl\": \"fern\", \"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"best_s\": %.4f, "
                "\"MB_per_s\": %.2f}\n", docs.size(), bytes, tokens, best, double(bytes) / best / 1e6);
    return 0;
  }
  if (!o.jsonl) {
    std::string all((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (o.decode) {
      std::cout << tok->decode(parse_ids(all, 1), o.skip_special);
    } else {
      std::cout << nlohmann::json(tok->encode(all)).dump() << "\n";
    }
    return 0;
  }
  std::string line;
  size_t lineno = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    if (o.decode) {
      std::cout << json_string(tok->decode(parse_ids(line, lineno), o.skip_special)) << "\n";
    } else {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_string()) fail("stdin line {}: expected a JSON string", lineno);
      std::cout << nlohmann::json(tok->encode(j.get<std::string>())).dump() << "\n";
    }
  }
  return 0;
}

Command reg("tokenize", "Encode text to token ids or decode ids to text with a tokenizer.json", [](CLI::App& app) {
  auto o = std::make_shared<Opts>();
  app.add_option("--tokenizer", o->tokenizer, "tokenizer.json, or a model directory that holds one")->required();
  app.add_flag("--jsonl", o->jsonl, "one JSON string (or, with --decode, one JSON array of ids) per line");
  app.add_flag("--decode", o->decode, "decode ids to text");
  app.add_flag("--skip-special", o->skip_special, "with --decode: drop special tokens");
  app.add_flag("--bench", o->bench, "with --jsonl: report single-thread encode throughput");
  return [o] { return run(*o); };
});

}  // namespace
}  // namespace fern::cli
