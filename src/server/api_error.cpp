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

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace fern::server
