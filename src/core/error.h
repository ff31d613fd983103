// Errors. Bad input (a checkpoint, a request, a tokenizer file) is reported by throwing fern::Error with a
// message that names the file and the key or tensor; callers at the boundary (CLI, server) catch it and turn it
// into a clear message or an HTTP error. Broken internal invariants use FERN_CHECK, which is on in release builds
// and throws fern::InternalError (the server answers 500 and keeps running).
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace fern {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& msg) : Error(msg) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void internal_fail(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace fern

#define FERN_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) ::fern::internal_fail(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)
