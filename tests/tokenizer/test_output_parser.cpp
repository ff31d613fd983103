// Output parser: reasoning / content / Qwen XML tool calls (MODEL.md 5.3). Every case is also pushed in random
// splits, byte by byte and token by token (through the real tokenizer's incremental decoder); the concatenated
// deltas must equal the one-pass result exactly.
// fern-test-labels: parser
#include <gtest/gtest.h>

#include <random>

#include "core/log.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tool_call_xml.h"
#include "tokenizer_fixtures.h"

namespace fern {
namespace {

using json = nlohmann::json;

json tools() {
  return json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"},"ratio":{"type":"number"},"flag":{"type":"boolean"},
      "opts":{"type":"object"},"list":{"type":"array"},"note":{"type":["string","null"]},"code":{"type":"string"},
      "count":{"type":"integer"}}}}},
    {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}])");
}

OutputParserOptions make_opts(bool thinking = true, bool with_tools = true) {
  log::set_level(log::Level::Error);  // malformed-call warnings are expected here, thousands of times
  OutputParserOptions o;
  o.thinking = thinking;
  if (with_tools) o.tools = tools();
  o.id_seed = 1234;
  return o;
}

// Feeds `chunks` one by one and rebuilds the message from the deltas alone.
ParsedOutput from_deltas(const std::vector<std::string>& chunks, const OutputParserOptions& o) {
  OutputParser p(o);
  ParsedOutput r;
  auto take = [&](const OutputDelta& d) {
    r.reasoning += d.reasoning;
    r.content += d.content;
    for (const auto& c : d.tool_calls) {
      EXPECT_EQ(c.index, int(r.tool_calls.size()));
      r.tool_calls.push_back({c.id, c.name, c.arguments});
    }
  };
  for (const auto& c : chunks) take(p.push(c));
  take(p.finish());
  EXPECT_TRUE(p.finish().empty());
  EXPECT_TRUE(p.push("more").empty());
  EXPECT_EQ(p.result().content, r.content);
  EXPECT_EQ(p.result().reasoning, r.reasoning);
  return r;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << what;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

// One-pass parse, checked against random splits, single bytes and real token pieces.
ParsedOutput parse_all_ways(const std::string& text, const OutputParserOptions& o) {
  ParsedOutput one = OutputParser::parse(text, o);
  std::mt19937 rng(uint32_t(text.size()) * 7919u + 1);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> chunks;
    for (size_t i = 0; i < text.size();) {
      size_t n = std::uniform_int_distribution<size_t>(0, 12)(rng);
      n = std::min(n, text.size() - i);
      chunks.push_back(text.substr(i, n));  // empty chunks too
      i += n;
    }
    expect_same(from_deltas(chunks, o), one, "random split " + std::to_string(trial));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(from_deltas(bytes, o), one, "byte by byte");
  const Tokenizer& tok = test::qwen3_tokenizer();
  IncrementalDecoder dec(tok);
  std::vector<std::string> pieces;
  for (int32_t id : tok.encode(text)) pieces.push_back(dec.push(id));
  pieces.push_back(dec.flush());
  expect_same(from_deltas(pieces, o), one, "token by token");
  return one;
}

TEST(OutputParser, ReasoningThenContent) {
  auto r = parse_all_ways("I should greet.\n</think>\n\nHello!", make_opts());
  EXPECT_EQ(r.reasoning, "I should greet.");
  EXPECT_EQ(r.content, "Hello!");
  EXPECT_TRUE(r.tool_calls.empty());
  r = parse_all_ways("<think>\nabc\n\ndef\n</think>\n\nx\n\ny", make_opts());
  EXPECT_EQ(r.reasoning, "abc\n\ndef");
  EXPECT_EQ(r.content, "x\n\ny");
}

TEST(OutputParser, ThinkingOffIsAllContent) {
  auto r = parse_all_ways("Hello <think>x</think> there", make_opts(false));
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hello <think>x</think> there");
}

TEST(OutputParser, TruncatedReasoningStaysReasoning) {
  auto r = parse_all_ways("Still thinking about </thi", make_opts());
  EXPECT_EQ(r.reasoning, "Still thinking about </thi");
  EXPECT_EQ(r.content, "");
}

TEST(OutputParser, SingleCallWithTypedValues) {
  const std::string text =
      "Need weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n<parameter=days>\n2\n</parameter>\n<parameter=ratio>\n3.0\n</parameter>\n<parameter=flag>\n"
      "false\n</parameter>\n<parameter=opts>\n{'unit': 'C', 'x': [True, None]}\n</parameter>\n<parameter=list>\n"
      "[1, \"two\"]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n<parameter=count>\nNone\n</parameter>\n"
      "<parameter=extra>\n123\n</parameter>\n</function>\n</tool_call>";
  auto r = parse_all_ways(text, make_opts());
  EXPECT_EQ(r.reasoning, "Need weather.");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(r.tool_calls[0].arguments,
            "{\"city\": \"Paris\", \"days\": 2, \"ratio\": 3, \"flag\": false, \"opts\": {\"unit\": \"C\", \"x\": "
            "[true, null]}, \"list\": [1, \"two\"], \"note\": null, \"count\": null, \"extra\": \"123\"}");
}

TEST(OutputParser, ParallelCallsAndMultiLineStrings) {
  const std::string text =
      "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=code>\ndef f():\n    return 1\n\n</parameter>\n"
      "<parameter=city>\n  spaced  \n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n"
      "</function>\n</tool_call>\n";
  auto r = parse_all_ways(text, make_opts());
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments)["code"], "def f():\n    return 1\n");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments)["city"], "  spaced  ");
  EXPECT_EQ(r.tool_calls[1].name, "now");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

TEST(OutputParser, ValuesThatDoNotFitTheSchemaStayStrings) {
  auto r = parse_all_ways("</think><tool_call><function=get_weather><parameter=days>two</parameter>"
                          "<parameter=flag>maybe</parameter><parameter=opts>{broken</parameter>"
                          "<parameter=city>null</parameter></function></tool_call>", make_opts());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments,
            "{\"days\": \"two\", \"flag\": \"maybe\", \"opts\": \"{broken\", \"city\": \"null\"}");
}

TEST(OutputParser, UnknownToolKeepsRawStrings) {
  auto r = parse_all_ways("</think>\n\n<tool_call>\n<function=mystery>\n<parameter=n>\n5\n</parameter>\n</function>\n"
                          "</tool_call>", make_opts());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "mystery");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"n\": \"5\"}");
}

TEST(OutputParser, CallTruncatedByMaxTokensIsContent) {
  const std::string tail = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  auto r = parse_all_ways("ok\n</think>\n\nChecking.\n\n" + tail, make_opts());
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "Checking.\n\n" + tail);
}

TEST(OutputParser, MalformedCallIsContentNeverDropped) {
  const std::string bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
  auto r = parse_all_ways("</think>\n\nBefore " + bad + " after", make_opts());
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "Before " + bad + " after");
  // A good call after a bad one still parses.
  r = parse_all_ways("</think>" + bad + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>", make_opts());
  EXPECT_EQ(r.content, bad);
  ASSERT_EQ(r.tool_calls.size(), 1u);
}

TEST(OutputParser, ToolCallInsideUnfinishedReasoning) {
  auto r = parse_all_ways("Let me call the tool.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                          "</parameter>\n</function>\n</tool_call>", make_opts());
  EXPECT_EQ(r.reasoning, "Let me call the tool.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  // Not followed by <function=: just words in the reasoning.
  r = parse_all_ways("I could use <tool_call> tags.\n</think>\n\nOK", make_opts());
  EXPECT_EQ(r.reasoning, "I could use <tool_call> tags.");
  EXPECT_EQ(r.content, "OK");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(OutputParser, WithoutToolsCallsStayContent) {
  const std::string call = "<tool_call>\n<function=now>\n</function>\n</tool_call>";
  auto r = parse_all_ways("</think>\n\n" + call, make_opts(true, false));
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, call);
}

TEST(OutputParser, LenientClosingTagsAndProseAfterCalls) {
  auto r = parse_all_ways("</think><tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\n3\n"
                          "</tool_call>\n\nDone.  ", make_opts());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Rome\", \"days\": 3}");
  EXPECT_EQ(r.content, "\n\nDone.  ");
}

TEST(OutputParser, RandomTextNeverLosesBytes) {
  // Whatever the mix of tags, every non-format byte comes back in reasoning + content or in a call.
  std::mt19937 rng(99);
  const std::vector<std::string> parts = {"<tool_call>", "</tool_call>", "<function=now>", "</function>",
                                          "<parameter=x>", "</parameter>", "</think>", "<think>", "\n", " ", "abc",
                                          "é", "<", "</", "<tool_", "{\"a\": 1}"};
  for (int t = 0; t < 200; ++t) {
    std::string text;
    for (int k = std::uniform_int_distribution<int>(1, 20)(rng); k > 0; --k)
      text += parts[std::uniform_int_distribution<size_t>(0, parts.size() - 1)(rng)];
    auto r = parse_all_ways(text, make_opts(t % 2 == 0));
    size_t letters = 0;
    for (size_t p = 0; (p = text.find("abc", p)) != std::string::npos; p += 3) ++letters;
    size_t got = 0;
    std::vector<const std::string*> outs = {&r.reasoning, &r.content};
    for (const auto& c : r.tool_calls) outs.push_back(&c.arguments);
    for (const std::string* s : outs)
      for (size_t p = 0; (p = s->find("abc", p)) != std::string::npos; p += 3) ++got;
    EXPECT_EQ(got, letters) << nlohmann::json(text).dump();
  }
}

TEST(PythonLiteral, ParsesAndRejects) {
  EXPECT_EQ(parse_python_literal("{'a': (1, 2.5), \"b\": [True, False, None], 'c': 'it\\'s'}")->dump(),
            R"({"a":[1,2.5],"b":[true,false,null],"c":"it's"})");
  EXPECT_FALSE(parse_python_literal("{'a': }"));
  EXPECT_FALSE(parse_python_literal("[1, 2"));
  EXPECT_FALSE(parse_python_literal(std::string(100, '[') + std::string(100, ']')));  // nesting limit
}

// A tools array from the request may hold a tool whose name is not a string: the schema lookup skips it instead of
// throwing a JSON type error, and the call to the well-formed tool still converts by its schema.
TEST(XmlToolCall, ToolWithNonStringNameIsSkipped) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":7}},
    {"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer"}}}}}])");
  std::string why;
  const auto call =
      parse_xml_tool_call("<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>", tools,
                          &why);
  ASSERT_TRUE(call) << why;
  EXPECT_EQ(call->name, "f");
  EXPECT_EQ(call->arguments.dump(), R"({"n":5})");
}

}  // namespace
}  // namespace fern
