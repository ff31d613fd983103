// fern eval's reference files (engine/reference_logits.h): a well-formed pair reads back exactly; every malformed
// field is a fern::Error that names the file, the case and the key, never a JSON-library exception or a read past
// the logits. fern-test-labels: parser
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/reference_logits.h"
#include "test_util.h"

namespace fern {
namespace {

constexpr int64_t kV = 5;

// `rows` rows of kV float32 logits with distinct values (row r, column j = 100 r + j + 0.25).
std::string blob_of(int64_t rows) {
  std::vector<float> v(size_t(rows * kV));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kV; ++j) v[size_t(r * kV + j)] = float(100 * r + j) + 0.25f;
  std::string b(v.size() * 4, '\0');
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

const char* kGood =
    R"({"vocab_size": 5, "cases": [{"prompt": [1, 2], "generated": [3], "row_offset": 0, "rows": 3},
                                   {"prompt": [4], "generated": [0, 0], "row_offset": 3, "rows": 3}]})";

void expect_error(const std::string& json, const std::string& blob, const std::string& needle) {
  try {
    parse_reference_logits(json, blob, kV, "ref");
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ReferenceLogits, ReadsCasesAndTheirRows) {
  const auto cases = parse_reference_logits(kGood, blob_of(6), kV, "ref");
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0].prompt, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(cases[0].generated, (std::vector<int32_t>{3}));
  EXPECT_EQ(cases[1].prompt, (std::vector<int32_t>{4}));
  ASSERT_EQ(cases[1].logits.size(), size_t(3 * kV));
  EXPECT_EQ(cases[0].logits[0], 0.25f);                 // row 0, column 0
  EXPECT_EQ(cases[1].logits[0], 300.25f);               // its first row is file row 3
  EXPECT_EQ(cases[1].logits[size_t(2 * kV + 4)], 504.25f);  // file row 5, column 4
}

TEST(ReferenceLogits, ReadsTheCheckedInGoldenFiles) {
  const auto cases = read_reference_logits(std::string(FERN_SOURCE_DIR) + "/tests/fixtures/golden/golden_hf", 1024);
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) EXPECT_EQ(c.logits.size(), (c.prompt.size() + c.generated.size()) * 1024);
}

// One case of the cases array with the given fields (a JSON object body).
std::string one_case(const std::string& fields) { return R"({"vocab_size": 5, "cases": [{)" + fields + "}]}"; }

TEST(ReferenceLogits, MalformedFilesAreNamedErrors) {
  const std::string b = blob_of(6);
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "ref.json: not a JSON object"},
      {"[1, 2]", "ref.json: not a JSON object"},
      {R"({"cases": []})", "vocab_size: expected an integer"},
      {R"({"vocab_size": "5", "cases": []})", "vocab_size: expected an integer"},
      {R"({"vocab_size": 7, "cases": []})", "vocab_size 7 differs from the model's 5"},
      {R"({"vocab_size": 5, "cases": {}})", "cases: expected an array"},
      {R"({"vocab_size": 5, "cases": []})", "no cases"},
      {R"({"vocab_size": 5, "cases": [3]})", "cases[0]: expected an object"},
      {one_case(R"("generated": [], "row_offset": 0, "rows": 0)"), "cases[0].prompt: expected an array"},
      {one_case(R"("prompt": ["a"], "generated": [], "row_offset": 0, "rows": 1)"),
       "cases[0].prompt: \"a\" is not a token id"},
      {one_case(R"("prompt": [5], "generated": [], "row_offset": 0, "rows": 1)"),
       "cases[0].prompt: 5 is not a token id below the vocabulary size 5"},
      {one_case(R"("prompt": [-1], "generated": [], "row_offset": 0, "rows": 1)"), "is not a token id"},
      {one_case(R"("prompt": [1], "generated": 2, "row_offset": 0, "rows": 1)"),
       "cases[0].generated: expected an array"},
      {one_case(R"("prompt": [1], "generated": [], "row_offset": -3, "rows": 1)"),
       "cases[0].row_offset: expected a non-negative integer"},
      {one_case(R"("prompt": [1], "generated": [], "row_offset": 0, "rows": 1.5)"),
       "cases[0].rows: expected a non-negative integer"},
      {one_case(R"("prompt": [1], "generated": [2], "row_offset": 0, "rows": 3)"),
       "rows 3 != prompt 1 + generated 1 tokens"},
      {one_case(R"("prompt": [], "generated": [], "row_offset": 0, "rows": 0)"), "cases[0]: no tokens"},
      // rows past the end of the logits, including an offset whose product with the vocabulary would overflow
      {one_case(R"("prompt": [1, 2], "generated": [], "row_offset": 5, "rows": 2)"),
       "cases[0] needs rows 5 .. 6, the file holds 6"},
      {one_case(R"("prompt": [1], "generated": [], "row_offset": 4611686018427387904, "rows": 1)"), "the file holds 6"},
  };
  for (const auto& [json, needle] : cases) expect_error(json, b, needle);
  // A logits file cut inside a row.
  expect_error(kGood, b.substr(0, b.size() - 3), "is not a whole number of rows");
}

TEST(ReferenceLogits, MissingFilesAreNamedErrors) {
  try {
    read_reference_logits("/nonexistent/golden", 1024);
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read /nonexistent/golden.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fern
