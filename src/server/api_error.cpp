#include "server/api_error.h"

namespace fern::server {

ApiError bad_request(const std::string& message, const std::string& param, const std::string& code) {
  return ApiError(400, "invalid_request_error", message, param, code);
}

nlohmann::json error_json(const ApiError& e) {
  nlohmann::json err = {{"message", e.what()},
                        {"type", e.type},
                        {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
                        {"code", e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code)}};
  for (auto& [k, v] : e.extra.items()) err[k] = v;
  return {{"error", err}};
}

nlohmann::json anthropic_error_json(const ApiError& e) {
  std::string type = e.type;
  if (e.code == "request_too_large") type = "request_too_large";
  else if (type == "unavailable_error") type = "overloaded_error";
  else if (type == "server_error") type = "api_error";
  else if (type != "rate_limit_error" && type != "authentication_error" && type != "not_found_error")
    type = "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace fern::server
