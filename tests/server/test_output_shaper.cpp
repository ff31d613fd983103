// OutputShaper: chat deltas from the output parser, the "<think>" probe for templates that leave the think block
// to the model (the tag split across pieces, absent, or the whole output shorter than it), parallel_tool_calls.
#include <gtest/gtest.h>

#include "server/output_shaper.h"

namespace fern::server {
namespace {

using nlohmann::json;

struct Collected {
  std::string reasoning, content;
  std::vector<json> tool_deltas;
};

Collected run(OutputShaper& s, const std::vector<std::string>& pieces) {
  Collected c;
  auto take = [&](const std::vector<json>& ds) {
    for (const auto& d : ds) {
      if (d.contains("reasoning_content")) c.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) c.content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& t : d["tool_calls"]) c.tool_deltas.push_back(t);
    }
  };
  for (const auto& p : pieces) take(s.push(p));
  take(s.finish());
  return c;
}

OutputParserOptions opts(bool thinking, json tools = nullptr) {
  OutputParserOptions o;
  o.thinking = thinking;
  o.tools = std::move(tools);
  return o;
}

TEST(OutputShaper, ThinkTagSplitAcrossPiecesIsDetected) {
  OutputShaper s(opts(false), true, /*detect_think=*/true);
  auto c = run(s, {"<th", "ink>", "\nI think", " hard.\n</think>\n\n", "Answer."});
  EXPECT_TRUE(s.thinking());
  EXPECT_EQ(c.reasoning, "I think hard.");
  EXPECT_EQ(c.content, "Answer.");
  EXPECT_EQ(s.message()["reasoning_content"], "I think hard.");
  EXPECT_EQ(s.message()["content"], "Answer.");
}

TEST(OutputShaper, NoThinkTagMeansContent) {
  OutputShaper s(opts(false), true, true);
  auto c = run(s, {"<t", "able> rows"});
  EXPECT_FALSE(s.thinking());
  EXPECT_EQ(c.content, "<table> rows");
  EXPECT_EQ(c.reasoning, "");
}

TEST(OutputShaper, OutputShorterThanTheTagIsContent) {
  OutputShaper s(opts(false), true, true);
  auto c = run(s, {"<th"});
  EXPECT_EQ(c.content, "<th");
  OutputShaper e(opts(false), true, true);
  EXPECT_EQ(run(e, {}).content, "");
}

TEST(OutputShaper, WithoutProbeTheTagIsLeftToTheParser) {
  OutputShaper s(opts(true), true, false);  // the prompt opened the think block
  auto c = run(s, {"reasoning\n</think>\n\nok"});
  EXPECT_EQ(c.reasoning, "reasoning");
  EXPECT_EQ(c.content, "ok");
}

TEST(OutputShaper, ParallelToolCallsFalseKeepsTheFirst) {
  json tools = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"type":"integer"}}}}}])");
  const std::string call1 = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>";
  const std::string call2 = "<tool_call>\n<function=f>\n<parameter=x>\n2\n</parameter>\n</function>\n</tool_call>";
  OutputShaper both(opts(false, tools), true);
  auto a = run(both, {call1, "\n", call2});
  EXPECT_TRUE(both.has_tool_calls());
  EXPECT_EQ(both.message()["tool_calls"].size(), 2u);
  EXPECT_TRUE(both.message()["content"].is_null());
  OutputShaper one(opts(false, tools), false);
  auto b = run(one, {call1, "\n", call2});
  EXPECT_EQ(one.message()["tool_calls"].size(), 1u);
  for (const auto& d : b.tool_deltas) EXPECT_EQ(d["index"], 0);
  EXPECT_EQ(json::parse(one.message()["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"x", 1}}));
  // The first fragment of a call carries id, type and name.
  ASSERT_FALSE(a.tool_deltas.empty());
  EXPECT_TRUE(a.tool_deltas[0].contains("id"));
  EXPECT_EQ(a.tool_deltas[0]["type"], "function");
  EXPECT_EQ(a.tool_deltas[0]["function"]["name"], "f");
}

TEST(OutputShaper, CompletionsPassTextThrough) {
  OutputShaper s(std::nullopt, true);
  auto d = s.push("raw <think> text");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]["text"], "raw <think> text");
  EXPECT_TRUE(s.finish().empty());
  EXPECT_EQ(s.text(), "raw <think> text");
}

}  // namespace
}  // namespace fern::server
