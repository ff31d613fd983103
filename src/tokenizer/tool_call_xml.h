// Parses one Qwen XML tool call (MODEL.md 5.3):
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// and converts each value by the tool's JSON schema into an OpenAI arguments object.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace fern {

struct XmlToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // object, in the order written
};

// `block` is the whole text from "<tool_call>" to "</tool_call>" inclusive. Returns nullopt (and the reason in
// *why) when it is not a well-formed call.
std::optional<XmlToolCall> parse_xml_tool_call(std::string_view block, const nlohmann::json& tools, std::string* why);

// One parameter value converted by its JSON schema (null schema = unknown parameter: the raw string).
nlohmann::ordered_json convert_parameter(const std::string& raw, const nlohmann::json* schema);

// Python literal (dict/list/tuple/str/int/float/True/False/None) as JSON; nullopt when `text` is not one.
std::optional<nlohmann::ordered_json> parse_python_literal(std::string_view text);

}  // namespace fern
