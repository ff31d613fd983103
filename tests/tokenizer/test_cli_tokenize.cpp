// `fern tokenize` end to end: runs the built binary (FERN_BINARY_DIR/fern) on JSONL input. Skipped when the binary
// was not built (a build of the tokenizer tests alone).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "tokenizer_fixtures.h"

namespace fern {
namespace {

struct CliResult {
  int status;
  std::string out;
};

CliResult run(const std::string& args, const std::string& input) {
  const std::string dir = test::temp_dir("cli");
  {
    std::ofstream(dir + "/in.txt", std::ios::binary) << input;
  }
  const std::string cmd = std::string(FERN_BINARY_DIR) + "/fern tokenize " + args + " < " + dir + "/in.txt 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

TEST(CliTokenize, EncodeDecodeJsonl) {
  if (!std::filesystem::exists(std::string(FERN_BINARY_DIR) + "/fern")) GTEST_SKIP() << "fern binary not built";
  const std::string tok = "--tokenizer " + test::source_path(test::kQwen3TokenizerDir);
  const Tokenizer& ref = test::qwen3_tokenizer();
  const std::vector<std::string> texts = {"Hello world", "<|im_start|>user\nnaïve 日本<|im_end|>", "e\u0301 👍🏽"};
  std::string in, want;
  for (const auto& t : texts) {
    in += nlohmann::json(t).dump() + "\n";
    want += nlohmann::json(ref.encode(t)).dump() + "\n";
  }
  CliResult enc = run(tok + " --jsonl", in);
  EXPECT_EQ(enc.status, 0) << enc.out;
  EXPECT_EQ(enc.out, want);
  CliResult dec = run(tok + " --jsonl --decode", enc.out);
  EXPECT_EQ(dec.status, 0) << dec.out;
  std::string want_text;
  for (const auto& t : texts) want_text += nlohmann::json(ref.decode(ref.encode(t))).dump() + "\n";
  EXPECT_EQ(dec.out, want_text);
  CliResult skip = run(tok + " --decode --skip-special", nlohmann::json(ref.encode("<|im_start|>hi")).dump());
  EXPECT_EQ(skip.out, "hi");
}

TEST(CliTokenize, BadInputIsAnErrorExit) {
  if (!std::filesystem::exists(std::string(FERN_BINARY_DIR) + "/fern")) GTEST_SKIP() << "fern binary not built";
  CliResult missing = run("--tokenizer /nonexistent/tokenizer.json --jsonl", "\"x\"\n");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("/nonexistent/tokenizer.json"), std::string::npos) << missing.out;
  CliResult bad = run("--tokenizer " + test::source_path(test::kQwen3TokenizerDir) + " --jsonl", "\"ok\"\nnot json\n");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("stdin line 2"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace fern
