// The Anthropic Messages API's request (POST /v1/messages) as the chat request of the OpenAI endpoint, so that both
// run through the same validation, template and generation: system prompt, text, tool_use / tool_result / thinking
// blocks, custom tools, tool_choice, stop_sequences, sampling, stream, thinking on request (off by default, as in
// that API). The model name is dropped (the one served model answers any name).
#pragma once
#include <nlohmann/json.hpp>

namespace fern::server {

// Key order is kept (the chat template serialises tool schemas in it). Throws ApiError (400) naming the field.
nlohmann::ordered_json chat_from_anthropic(const nlohmann::ordered_json& request);

}  // namespace fern::server
