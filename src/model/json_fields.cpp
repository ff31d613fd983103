#include "model/json_fields.h"

#include <cmath>

#include "core/error.h"

namespace fern {

nlohmann::json parse_json_bounded(const std::string& text, const std::string& source, int max_depth) {
  // The callback sees every value while parsing; refusing deep nesting there keeps a hostile file from
  // building a 100,000-level tree (and from deep recursion when it is destroyed).
  auto cb = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > max_depth) fail("{}: JSON nested deeper than {} levels", source, max_depth);
    return true;
  };
  try {
    nlohmann::json j = nlohmann::json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    return j;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", source, e.what());
  }
}

std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

void JsonFields::bad(const char* key, const std::string& why) const {
  fail("{}: {}", where(key), why);
}

int64_t JsonFields::get_int(const char* key, int64_t lo, int64_t hi) const {
  if (!has(key)) bad(key, "missing (required)");
  const auto& v = obj.at(key);
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) bad(key, fmt::format("{} is out of range [{}, {}]", u, lo, hi));
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    bad(key, "must be an integer, got " + json_brief(v));
  }
  if (x < lo || x > hi) bad(key, fmt::format("{} is out of range [{}, {}]", x, lo, hi));
  return x;
}

int64_t JsonFields::get_int(const char* key, int64_t lo, int64_t hi, int64_t dflt) const {
  return has(key) ? get_int(key, lo, hi) : dflt;
}

double JsonFields::get_double(const char* key, double lo, double hi, double dflt) const {
  if (!has(key)) return dflt;
  const auto& v = obj.at(key);
  if (!v.is_number()) bad(key, "must be a number, got " + json_brief(v));
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad(key, fmt::format("{} is out of range [{}, {}]", x, lo, hi));
  return x;
}

bool JsonFields::get_bool(const char* key, bool dflt) const {
  if (!has(key)) return dflt;
  const auto& v = obj.at(key);
  if (!v.is_boolean()) bad(key, "must be true or false, got " + json_brief(v));
  return v.get<bool>();
}

std::string JsonFields::get_string(const char* key, const std::string& dflt) const {
  if (!has(key)) return dflt;
  const auto& v = obj.at(key);
  if (!v.is_string()) bad(key, "must be a string, got " + json_brief(v));
  return v.get<std::string>();
}

}  // namespace fern
