// Typed, bounded reads of JSON fields with errors that name the file and the key path ("config.json: key
// text_config.hidden_size: must be an integer, got \"4096\""). Used by the config, index and header parsers.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace fern {

// Parses JSON text, rejecting nesting deeper than `max_depth` and anything that is not valid JSON.
nlohmann::json parse_json_bounded(const std::string& text, const std::string& source, int max_depth = 64);

struct JsonFields {
  const nlohmann::json& obj;  // must be an object
  std::string source;         // file name for messages
  std::string path;           // key path prefix ("" or "text_config.")

  bool has(const char* key) const { return obj.contains(key) && !obj.at(key).is_null(); }
  std::string where(const char* key) const { return source + ": key " + path + key; }
  [[noreturn]] void bad(const char* key, const std::string& why) const;

  int64_t get_int(const char* key, int64_t lo, int64_t hi) const;                     // required
  int64_t get_int(const char* key, int64_t lo, int64_t hi, int64_t dflt) const;       // optional
  double get_double(const char* key, double lo, double hi, double dflt) const;        // optional
  bool get_bool(const char* key, bool dflt) const;
  std::string get_string(const char* key, const std::string& dflt) const;
};

// A short rendering of a JSON value for error messages (truncated).
std::string json_brief(const nlohmann::json& v);

}  // namespace fern
