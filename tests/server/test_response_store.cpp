// The Responses API's conversation store: the most recent kCapacity entries, fewer when they exceed kMaxBytes.
#include <gtest/gtest.h>

#include "server/server_impl.h"

namespace fern::server {
namespace {

std::string id(const char* prefix, size_t i) {  // (not "r" + to_string: GCC 12 warns there, wrongly, with -Wrestrict)
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

TEST(ResponseStore, KeepsTheMostRecentWithinCountAndBytes) {
  ResponseStore store;
  for (size_t i = 0; i < ResponseStore::kCapacity + 10; ++i)
    store.put(id("r", i), nlohmann::ordered_json::array({{{"role", "user"}, {"content", std::to_string(i)}}}));
  EXPECT_FALSE(store.get("r0").has_value());
  EXPECT_FALSE(store.get("r9").has_value());
  ASSERT_TRUE(store.get("r10").has_value());
  EXPECT_EQ((*store.get("r10"))[0]["content"], "10");
  EXPECT_TRUE(store.get(id("r", ResponseStore::kCapacity + 9)).has_value());
  // Large conversations: the byte budget evicts the oldest, never the one just stored.
  const std::string big(ResponseStore::kMaxBytes / 3, 'x');
  for (size_t i = 0; i < 4; ++i) store.put(id("big", i), nlohmann::ordered_json::array({big}));
  EXPECT_FALSE(store.get("big0").has_value());
  EXPECT_FALSE(store.get("r300").has_value());
  EXPECT_TRUE(store.get("big3").has_value());
  EXPECT_TRUE(store.get("big2").has_value());
}

}  // namespace
}  // namespace fern::server
