// libFuzzer target: the structured-output schema compiler and JSON matcher. The input is a schema (JSON text up to
// the first NUL byte; without one, "any JSON object") and then bytes offered to the matcher one at a time.
// Invariants: no crash; a refused byte leaves the state as it was; and whenever the accepted bytes make a whole
// value, they parse as JSON (the matcher never calls an invalid text complete).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "engine/json_constraint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* begin = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(data, 0, size);
  std::shared_ptr<const fern::JsonSchema> schema;
  size_t text_at = 0;
  if (nul) {
    text_at = size_t(static_cast<const uint8_t*>(nul) - data) + 1;
    const nlohmann::json j = nlohmann::json::parse(begin, begin + text_at - 1, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    try {
      schema = fern::JsonSchema::compile(j);
    } catch (const fern::InternalError&) {
      std::abort();  // a broken invariant, not a bad schema
    } catch (const fern::Error&) {
      return 0;  // refused with a message: what the server turns into a 400
    }
  } else {
    schema = fern::JsonSchema::any_object();
  }
  fern::JsonMatcher m(schema, /*allow_tool_call=*/size % 2 == 1);
  std::string accepted;
  for (size_t i = text_at; i < size; ++i) {
    const std::string b(1, static_cast<char>(data[i]));
    const bool was_complete = m.complete();
    const bool ok = m.accepts(b);
    if (m.feed(b) != ok) std::abort();
    if (!ok) {
      if (m.complete() != was_complete || m.accepts(b)) std::abort();
      continue;
    }
    accepted += b;
    if (m.complete() && !m.unconstrained() &&
        nlohmann::json::parse(accepted, nullptr, /*allow_exceptions=*/false).is_discarded())
      std::abort();
  }
  return 0;
}
