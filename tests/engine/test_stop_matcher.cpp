// Stop strings over streamed text: found when split across pieces, never shown, held-back text released when it
// stops matching, and nothing lost at the end.
#include <gtest/gtest.h>

#include <random>

#include "engine/stop_matcher.h"

namespace fern {
namespace {

// Feeds `pieces` and returns (emitted text, stopped).
std::pair<std::string, bool> run(std::vector<std::string> stops, const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.push(p);
    out += r.text;
    if (r.stopped) return {out, true};
  }
  out += m.flush();
  return {out, false};
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  auto [out, stopped] = run({}, {"Hello", ", ", "world"});
  EXPECT_EQ(out, "Hello, world");
  EXPECT_FALSE(stopped);
}

TEST(StopMatcher, StopSplitAcrossPieces) {
  auto [out, stopped] = run({"END"}, {"abc E", "N", "D tail"});
  EXPECT_EQ(out, "abc ");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcher, HeldPrefixIsReleasedWhenItDiverges) {
  StopMatcher m({"</stop>"});
  auto r1 = m.push("x </s");
  EXPECT_EQ(r1.text, "x ");  // "</s" could start the stop string
  auto r2 = m.push("ection>");
  EXPECT_EQ(r2.text, "</section>");
  EXPECT_FALSE(r2.stopped);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  auto [out, stopped] = run({"world", "lo, w"}, {"Hello, world"});
  EXPECT_EQ(out, "Hel");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcher, PrefixStillHeldAtTheEndIsFlushed) {
  auto [out, stopped] = run({"###"}, {"a #", "#"});
  EXPECT_EQ(out, "a ##");
  EXPECT_FALSE(stopped);
}

TEST(StopMatcher, MultiByteStopAndTextStayWholeCharacters) {
  // "。" is 3 bytes; pieces split inside neither (the decoder emits whole characters).
  auto [out, stopped] = run({"。終"}, {"日本語", "。", "終わり"});
  EXPECT_EQ(out, "日本語");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcher, AfterAStopNothingMoreIsEmitted) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.push("abxcd").stopped);
  EXPECT_EQ(m.push("more").text, "");
  EXPECT_EQ(m.flush(), "");
}

// Random texts cut at random points: the output equals the text up to the first stop, however it is split.
TEST(StopMatcher, RandomSplitsAgreeWithOnePass) {
  std::mt19937 rng(5);
  const std::string alphabet = "ab<>/ ";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int i = 0; i < 40; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops = {"</a>", "bb a"};
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, text.find(s));
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      size_t n = 1 + rng() % 4;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    auto [out, stopped] = run(stops, pieces);
    EXPECT_EQ(stopped, first != std::string::npos) << text;
    EXPECT_EQ(out, first == std::string::npos ? text : text.substr(0, first)) << text;
  }
}

}  // namespace
}  // namespace fern

