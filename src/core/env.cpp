#include "core/env.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace fern {

int env_choice(const char* name, std::initializer_list<std::string_view> choices, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int i = 0;
  std::string expected;
  for (std::string_view c : choices) {
    if (c == v) return i;
    expected += (i == 0 ? "" : i + 1 == static_cast<int>(choices.size()) ? " or " : ", ") + std::string(c);
    ++i;
  }
  fail("{}={}: expected {}", name, v, expected);
}

long env_int(const char* name, long lo, long hi, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < lo || n > hi) fail("{}={}: expected a whole number from {} to {}", name, v, lo, hi);
  return n;
}

}  // namespace fern
