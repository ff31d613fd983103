// The OpenAI Responses API's request (POST /v1/responses) as the chat request of /v1/chat/completions, so that both
// run through the same validation, template and generation: `instructions`, `input` (text, messages, function calls
// and their outputs, reasoning items), function tools, tool_choice, max_output_tokens, sampling, `text.format`
// (structured output), `reasoning.effort` ("none" turns thinking off), stream. A conversation continued with
// previous_response_id starts from the stored one's messages.
#pragma once
#include <nlohmann/json.hpp>

namespace fern::server {

// `history`: the chat messages of the conversation previous_response_id names (null: none). Key order is kept.
// Throws ApiError (400) naming the field.
nlohmann::ordered_json chat_from_responses(const nlohmann::ordered_json& request, const nlohmann::ordered_json* history);

}  // namespace fern::server
