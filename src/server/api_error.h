// OpenAI-shaped API errors: {"error": {"message", "type", "param", "code"}} with the HTTP status that the SDKs map
// to their typed errors (400 BadRequest, 401 Authentication, 404 NotFound, 413, 429 RateLimit, 5xx InternalServer).
#pragma once
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace fern::server {

struct ApiError : std::runtime_error {
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
  std::string param;  // the request field at fault ("" = null)
  std::string code;   // string code ("" = null), e.g. context_length_exceeded
  nlohmann::json extra = nlohmann::json::object();  // more fields in the error object (token counts)
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
};

// 400 invalid_request_error naming `param`.
ApiError bad_request(const std::string& message, const std::string& param = "", const std::string& code = "");

nlohmann::json error_json(const ApiError& e);
// The same error in the Anthropic Messages API's envelope: {"type": "error", "error": {"type", "message"}}.
nlohmann::json anthropic_error_json(const ApiError& e);
// Serialises JSON for the wire; invalid UTF-8 inside strings is replaced (never throws).
std::string dump_json(const nlohmann::json& j);

}  // namespace fern::server
