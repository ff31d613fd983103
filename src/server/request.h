// Parsing and validating the JSON bodies of POST /v1/chat/completions and POST /v1/completions into one request
// description. Every rejection is an ApiError 400 that names the parameter; unknown fields are accepted (and
// logged at debug level), never rejected.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "engine/sampler.h"

namespace fern::server {

struct RequestLimits {
  int max_json_depth = 64;
  size_t max_stop = 16;             // stop strings
  size_t max_stop_bytes = 1024;     // per stop string
  size_t max_tools = 128;
  size_t max_logit_bias = 1024;
  int64_t vocab_size = 0;           // logit_bias ids must be below this
  bool allow_forced_output = false; // --test-forced-output
};

enum class ToolChoice { None, Auto, Required, Named };

struct ApiRequest {
  bool chat = true;
  std::string model;                    // as sent ("" when absent)
  nlohmann::json messages;              // chat: validated, developer role mapped to system
  nlohmann::json tools;                 // null when absent
  std::string prompt;                   // completions: the prompt text
  std::vector<int32_t> prompt_tokens;   // completions: a prompt given as token ids
  bool prompt_is_tokens = false;
  bool stream = false;
  bool include_usage = false;
  int64_t max_tokens = 0;               // 0 = not given
  SamplingParams sampling;
  std::vector<std::string> stop;
  ToolChoice tool_choice = ToolChoice::None;
  std::string named_tool;
  bool parallel_tool_calls = true;
  std::optional<bool> enable_thinking;
  bool preserve_thinking = false;
  std::string cache_key;                // prompt_cache_key
  int top_logprobs = -1;                // chat: -1 without `logprobs`, else `top_logprobs` (0 when absent)
  std::shared_ptr<const JsonSchema> json_schema;  // response_format json_object / json_schema; null for text
  bool ignore_eos = false;              // vendor extra: generate up to max_tokens
  std::optional<std::string> forced_output;  // test-only
};

// Throws ApiError (400) on invalid input.
ApiRequest parse_request(const std::string& body, bool chat, const RequestLimits& limits);

// A request body as a JSON object, key order kept (the other APIs' bodies, translated before parse_request): an
// empty body, nesting deeper than the limit, invalid JSON or a value other than an object is ApiError 400, whose
// message never echoes request bytes.
nlohmann::ordered_json parse_json_object(const std::string& body, const RequestLimits& limits);

// Deepest nesting of arrays/objects in a JSON text (strings skipped), computed before parsing so that a hostile
// body cannot make the parser, copies or the destructor recurse deeply.
int json_nesting_depth(const std::string& text);

}  // namespace fern::server
