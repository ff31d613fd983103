// libFuzzer target: chat rendering from an arbitrary request body ({"messages": ..., "tools": ...} as JSON).
// Malformed input must be a fern::Error, never a crash or another exception.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/chat_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto j = nlohmann::ordered_json::parse(data + 1, data + size, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;
  // Requests are depth-limited before they get here (server), so very deep values are skipped, as there.
  if (j.dump().size() > 1 << 16) return 0;
  fern::ChatOptions o;
  o.kind = static_cast<fern::ChatTemplateKind>(data[0] % 3);
  o.enable_thinking = data[0] & 4;
  o.preserve_thinking = data[0] & 8;
  o.add_generation_prompt = data[0] & 16;
  try {
    (void)fern::render_chat(j.value("messages", nlohmann::ordered_json()), j.value("tools", nlohmann::ordered_json()),
                            o);
  } catch (const fern::Error&) {
  }
  return 0;
}
