// Python-compatible text forms used by the chat templates: json.dumps(x, ensure_ascii=False) with the default
// ", " / ": " separators and keys in insertion order (HF's `tojson` filter), Python's str() of scalars
// (True/False/None, float repr), and str.strip()'s notion of whitespace (Jinja's `trim`).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace fern::py {

// json.dumps(v, ensure_ascii=False). Throws fern::Error for invalid UTF-8 in strings.
std::string dumps(const nlohmann::ordered_json& v);
// str(v): strings raw, True/False/None, ints, float repr; containers as dumps() (the Qwen3.5 template only calls
// str() on scalars).
std::string str(const nlohmann::ordered_json& v);
// float.__repr__ (shortest round-trip digits; exponent form below 1e-4 and from 1e16).
std::string float_repr(double d);

bool is_space(uint32_t cp);
// str.strip() / lstrip() / rstrip() with no argument (Unicode whitespace).
std::string_view strip(std::string_view s);
// str.strip(chars) for ASCII chars.
std::string_view strip_chars(std::string_view s, std::string_view chars, bool left = true, bool right = true);

}  // namespace fern::py
