#include "core/error.h"

namespace fern {

void internal_fail(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(fmt::format("internal error at {}:{}: check `{}` failed: {}", file, line, cond, msg));
}

}  // namespace fern
