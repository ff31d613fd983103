// The environment switches' parser (core/env.h): each accepted value, the fallback when unset or empty, and a
// clear error naming the switch for anything else.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "core/env.h"
#include "core/error.h"

namespace fern {
namespace {

constexpr const char* kVar = "FERN_TEST_ENV_SWITCH";

struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (value) setenv(kVar, value, 1);
    else unsetenv(kVar);
  }
  ~EnvGuard() { unsetenv(kVar); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EnvChoice, ValuesFallbackAndErrors) {
  {
    EnvGuard g(nullptr);
    EXPECT_EQ(env_choice(kVar, {"auto", "scan", "chunked"}, 0), 0);
    EXPECT_EQ(env_choice(kVar, {"auto", "scan", "chunked"}, -1), -1);
  }
  {
    EnvGuard g("");
    EXPECT_EQ(env_choice(kVar, {"auto", "scan"}, 7), 7);
  }
  {
    EnvGuard g("chunked");
    EXPECT_EQ(env_choice(kVar, {"auto", "scan", "chunked"}, 0), 2);
  }
  {
    EnvGuard g("Chunked");  // case matters: a near miss is an error, not the default
    const std::string e = error_of([] { env_choice(kVar, {"auto", "scan", "chunked"}, 0); });
    EXPECT_EQ(e, "FERN_TEST_ENV_SWITCH=Chunked: expected auto, scan or chunked");
  }
  {
    EnvGuard g("2");
    const std::string e = error_of([] { env_choice(kVar, {"0", "1"}, 1); });
    EXPECT_EQ(e, "FERN_TEST_ENV_SWITCH=2: expected 0 or 1");
  }
}

TEST(EnvInt, RangeFallbackAndErrors) {
  {
    EnvGuard g(nullptr);
    EXPECT_EQ(env_int(kVar, 1, 64, 0), 0);
  }
  {
    EnvGuard g("64");
    EXPECT_EQ(env_int(kVar, 1, 64, 0), 64);
  }
  for (const char* bad : {"0", "65", "8x", "x", "-1", "99999999999999999999"}) {
    EnvGuard g(bad);
    const std::string e = error_of([] { env_int(kVar, 1, 64, 0); });
    EXPECT_EQ(e, std::string("FERN_TEST_ENV_SWITCH=") + bad + ": expected a whole number from 1 to 64") << bad;
  }
}

}  // namespace
}  // namespace fern
