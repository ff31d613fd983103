// libFuzzer target: the output parser (reasoning / content / XML tool calls). The first byte picks the options
// and the chunk size; the rest is model output. Invariants: no crash, and the deltas pushed in chunks concatenate
// to exactly the one-pass result.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/log.h"
#include "tokenizer/output_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static bool quiet = (fern::log::set_level(fern::log::Level::Error), true);
  (void)quiet;
  const uint8_t mode = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  fern::OutputParserOptions o;
  o.thinking = mode & 1;
  if (mode & 2)
    o.tools = nlohmann::json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"s":{"type":"string"},"i":{"type":"integer"},"n":{"type":"number"},"b":{"type":"boolean"},
      "o":{"type":"object"},"a":{"type":"array"},"z":{"type":["string","null"]}}}}}])");
  o.id_seed = 7;
  const fern::ParsedOutput one = fern::OutputParser::parse(text, o);
  const size_t chunk = 1 + (mode >> 2);
  fern::OutputParser p(o);
  fern::ParsedOutput acc;
  auto take = [&](const fern::OutputDelta& d) {
    acc.reasoning += d.reasoning;
    acc.content += d.content;
    for (const auto& c : d.tool_calls) acc.tool_calls.push_back({c.id, c.name, c.arguments});
  };
  for (size_t i = 0; i < text.size(); i += chunk) take(p.push(text.substr(i, chunk)));
  take(p.finish());
  if (acc.reasoning != one.reasoning || acc.content != one.content || acc.tool_calls.size() != one.tool_calls.size())
    std::abort();
  for (size_t i = 0; i < acc.tool_calls.size(); ++i)
    if (acc.tool_calls[i].arguments != one.tool_calls[i].arguments || acc.tool_calls[i].name != one.tool_calls[i].name)
      std::abort();
  return 0;
}
