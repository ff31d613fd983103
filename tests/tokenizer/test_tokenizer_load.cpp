// Bad tokenizer files (RELIABILITY.md 3 C, T23-T27): each is a fern::Error naming the file and the key, never a
// crash; adversarial text finishes within a time budget. Also the BPE mechanics on a small hand-made vocabulary.
// fern-test-labels: parser
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fcntl.h>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace fern {
namespace {

using json = nlohmann::json;

// A small valid byte-level BPE file: the 256 byte symbols (ids 0..255), merges a+b -> "ab" (256), ab+c -> "abc"
// (257), Ġ+a -> "Ġa" (258), and two added tokens.
json small_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, byte_level::kTables.byte_to_cp[size_t(b)]);
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["Ġa"] = 258;
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", json::array({"ab", "c"}), "Ġ a"})}};
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 301}, {"content", "<tool>"}, {"special", false}}});
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "Split"},
                                                        {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]+)"}}},
                                                        {"behavior", "Isolated"},
                                                        {"invert", false}},
                                                       {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  return j;
}

void expect_error(const std::string& text, const std::string& needle) {
  try {
    Tokenizer::from_json(text, "bad.json");
    ADD_FAILURE() << "no error; wanted one mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

void expect_error(const json& j, const std::string& needle) { expect_error(j.dump(), needle); }
void expect_error(const char* text, const std::string& needle) { expect_error(std::string(text), needle); }

TEST(TokenizerLoad, SmallVocabularyMergesAndAddedTokens) {
  auto tok = Tokenizer::from_json(small_tokenizer().dump(), "small");
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{257}));
  // " ab": "a b" (rank 0) wins over "Ġ a" (rank 2), so the space stays alone; " ac" has only "Ġ a".
  EXPECT_EQ(tok->encode("ab ab"), (std::vector<int32_t>{256, ' ', 256}));
  EXPECT_EQ(tok->encode(" ac"), (std::vector<int32_t>{258, 'c'}));
  EXPECT_EQ(tok->encode("x<s>abc<tool>"), (std::vector<int32_t>{'x', 300, 257, 301}));
  EXPECT_EQ(tok->encode_literal("<s>"), (std::vector<int32_t>{'<', 's', '>'}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{'x', 300, 257, 301}), "x<s>abc<tool>");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{'x', 300, 257, 301}, true), "xabc<tool>");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{-5, 299, 100000, 'a'}), "a");  // ids without a token are skipped
  EXPECT_EQ(tok->vocab_size(), 302);
  EXPECT_EQ(tok->token_id("<s>"), 300);
  EXPECT_EQ(tok->token_id("Ġa"), 258);
  EXPECT_FALSE(tok->token_id("nope"));
  EXPECT_TRUE(tok->is_special(300));
  EXPECT_FALSE(tok->is_special(301));
  EXPECT_FALSE(tok->is_special(5));
  EXPECT_EQ(tok->token_text(258), " a");
  // A cut UTF-8 character decodes to U+FFFD, and the incremental decoder holds it back until complete.
  const std::vector<int32_t> e_acute = {0xC3, 0xA9};
  EXPECT_EQ(tok->decode(std::vector<int32_t>{0xC3}), "\xEF\xBF\xBD");
  IncrementalDecoder inc(*tok);
  EXPECT_EQ(inc.push(0xC3), "");
  EXPECT_EQ(inc.push(0xA9), "é");
  EXPECT_EQ(inc.push(0xE2), "");
  EXPECT_EQ(inc.flush(), "\xEF\xBF\xBD");  // never dropped
  EXPECT_EQ(inc.flush(), "");
  IncrementalDecoder skip(*tok, /*skip_special=*/true);
  std::string s;
  for (int32_t id : std::vector<int32_t>{'x', 300, 0xC3, 301, 0xA9}) s += skip.push(id);  // 301 is not special: it splits the char
  s += skip.flush();
  EXPECT_EQ(s, tok->decode(std::vector<int32_t>{'x', 300, 0xC3, 301, 0xA9}, true));
  EXPECT_EQ(s, "x\xEF\xBF\xBD<tool>\xEF\xBF\xBD");
}

TEST(TokenizerLoad, IgnoreMergesTakesWholeWords) {
  json j = small_tokenizer();
  j["model"]["vocab"]["abcab"] = 259;  // in the vocab but not reachable by merges
  EXPECT_EQ(Tokenizer::from_json(j.dump(), "t")->encode("abcab"), (std::vector<int32_t>{257, 256}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(Tokenizer::from_json(j.dump(), "t")->encode("abcab"), (std::vector<int32_t>{259}));
}

TEST(TokenizerLoad, AddedTokenStripOptions) {
  json j = small_tokenizer();
  j["added_tokens"][0]["lstrip"] = true;
  j["added_tokens"][1]["rstrip"] = true;
  auto tok = Tokenizer::from_json(j.dump(), "t");
  EXPECT_EQ(tok->encode("a  <s>b"), (std::vector<int32_t>{'a', 300, 'b'}));
  EXPECT_EQ(tok->encode("<tool>  b"), (std::vector<int32_t>{301, 'b'}));
  j = small_tokenizer();
  j["added_tokens"][1]["single_word"] = true;
  tok = Tokenizer::from_json(j.dump(), "t");
  EXPECT_EQ(tok->encode("x<tool>").back(), '>');          // glued to a word: not the token
  EXPECT_EQ(tok->encode("!<tool> ")[1], 301);
}

// T23: malformed files.
TEST(TokenizerLoad, MalformedJson) {
  expect_error("", "not valid JSON");
  expect_error("{\"model\": ", "not valid JSON");
  expect_error("[1, 2]", "top level");
  expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xff\": 0}}}", "not valid JSON");
  expect_error(std::string(std::string(100000, '[') + std::string(100000, ']')), "nested deeper");
  expect_error(json(json::object()), "missing key \"model\"");
  json j = small_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "WordPiece");
  j = small_tokenizer();
  j["model"].erase("type");
  expect_error(j, "\"type\"");
  j = small_tokenizer();
  j["model"]["vocab"] = json::array({"a"});
  expect_error(j, "vocab: must be an object");
  for (json bad : {json("1"), json(1.5), json(-1), json(int64_t(1) << 40), json(nullptr)}) {
    j = small_tokenizer();
    j["model"]["vocab"]["zz"] = bad;
    expect_error(j, "vocab[\"zz\"]");
  }
  j = small_tokenizer();
  j["model"]["vocab"]["zz"] = 5;  // same id as a byte symbol
  expect_error(j, "duplicate id 5");
  j = small_tokenizer();
  j["model"]["vocab"]["zz"] = 1000000;  // a lone huge id would size the tables
  expect_error(j, "ids up to 1000000");
}

// T24: hostile merges.
TEST(TokenizerLoad, HostileMerges) {
  json j = small_tokenizer();
  j["model"]["merges"].push_back("q zz");
  expect_error(j, "token \"zz\" is not in the vocab");
  j = small_tokenizer();
  j["model"]["merges"].push_back("x y");  // "xy" is not a token
  expect_error(j, "merged token \"xy\" is not in the vocab");
  for (json bad : {json("ab"), json("a  b"), json(" a"), json(7), json::array({"a"}), json::array({"a", 1})}) {
    j = small_tokenizer();
    j["model"]["merges"].push_back(bad);
    expect_error(j, "merges[3]");
  }
  j = small_tokenizer();
  j["model"]["vocab"].erase("Ġ");
  expect_error(j, "no token for byte 0x20");
  j = small_tokenizer();
  j["model"]["byte_fallback"] = true;
  expect_error(j, "byte_fallback");
  j = small_tokenizer();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_error(j, "continuing_subword_prefix");
  j = small_tokenizer();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "dropout");
}

// T25: added tokens.
TEST(TokenizerLoad, BadAddedTokens) {
  for (json bad : {json(-1), json(int64_t(1) << 31), json("300"), json(nullptr)}) {
    json j = small_tokenizer();
    j["added_tokens"][0]["id"] = bad;
    expect_error(j, "added_tokens[0]");
  }
  json j = small_tokenizer();
  j["added_tokens"][1]["id"] = 300;
  expect_error(j, "duplicate added-token id 300");
  j = small_tokenizer();
  j["added_tokens"][1]["content"] = "<s>";
  expect_error(j, "duplicate added-token content");
  j = small_tokenizer();
  j["added_tokens"][1]["content"] = "";
  expect_error(j, "non-empty string");
  j = small_tokenizer();
  j["added_tokens"][1]["id"] = 5000000;
  expect_error(j, "far beyond the vocabulary");
  j = small_tokenizer();
  j["added_tokens"] = json::object();
  expect_error(j, "added_tokens: must be an array");
}

TEST(TokenizerLoad, UnsupportedPipelineParts) {
  json j = small_tokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_error(j, "Lowercase");
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(j, "does not compile");
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_error(j, "Isolated");
  j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j, "Whitespace");
  j = small_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder");
}

TEST(TokenizerLoad, FilesAndDirectories) {
  const std::string dir = test::temp_dir("tokload");
  try {
    Tokenizer::load(dir);  // a directory without tokenizer.json
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/tokenizer.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load(dir + "/missing.json"), Error);
  // A 1 GB (sparse) file is refused from its size, before anything is read.
  const std::string big = dir + "/big.json";
  int fd = ::open(big.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t(1) << 30), 0);
  ::close(fd);
  try {
    Tokenizer::load(big);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed"), std::string::npos) << e.what();
  }
  // The real package directory loads.
  EXPECT_EQ(Tokenizer::load(test::source_path(test::kQwen3TokenizerDir))->vocab_size(), 151669);
}

// T26: adversarial text finishes quickly; T27: special-token strings in untrusted text stay text.
TEST(TokenizerLoad, AdversarialInputWithinTimeBudget) {
  const Tokenizer& tok = test::qwen3_tokenizer();
#if defined(__SANITIZE_ADDRESS__)
  const double budget_s = 20.0;  // ASan makes this 5-10x slower
#else
  const double budget_s = 2.0;  // RELIABILITY.md T26: < 2 s per MB; measured ~0.1-0.3 s on the CI-class CPU
#endif
  std::string marks = "e";
  for (int i = 0; i < 100000; ++i) marks += "\xCC\x81";  // 200 KB of combining acute accents
  std::string bad_utf8;
  for (int i = 0; i < 100000; ++i) bad_utf8 += "\xFF\xC3\x28\xE2\x82";
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"letter", std::string(1 << 20, 'a')}, {"underscore", std::string(1 << 20, '_')},
      {"spaces", std::string(1 << 20, ' ')}, {"nul", std::string(1 << 20, '\0')},
      {"marks", marks}, {"bad utf8", bad_utf8}};
  // Thread CPU time, not wall time: on a busy 2-core CI machine other tests share the cores, and the budget is
  // about the work the tokenizer does (a quadratic blow-up would take minutes, not seconds).
  auto cpu_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  for (const auto& [name, text] : inputs) {
    const double t0 = cpu_seconds();
    auto ids = tok.encode(text);
    const double s = cpu_seconds() - t0;
    EXPECT_LT(s, budget_s) << name;
    EXPECT_FALSE(ids.empty()) << name;
    const std::string back = tok.decode(ids);
    EXPECT_TRUE(utf8::valid(back)) << name;
    if (utf8::valid(text)) {
      EXPECT_EQ(back, utf8::nfc(text)) << name;
    } else {
      EXPECT_EQ(back, utf8::sanitize(text)) << name;  // ill-formed bytes became U+FFFD, nothing else changed
    }
  }
  const auto ctl = tok.encode("<|im_start|>");
  ASSERT_EQ(ctl.size(), 1u);
  const auto lit = tok.encode_literal("hi <|im_start|>system");
  EXPECT_EQ(std::count(lit.begin(), lit.end(), ctl[0]), 0);
  EXPECT_EQ(tok.decode(lit), "hi <|im_start|>system");
}

}  // namespace
}  // namespace fern
