#include "tokenizer/tool_call_xml.h"

#include <cmath>
#include <set>

#include "tokenizer/py_format.h"
#include "tokenizer/utf8.h"

namespace fern {
namespace {

using ojson = nlohmann::ordered_json;

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void skip_ws(std::string_view s, size_t& i) {
  while (i < s.size() && is_ws(s[i])) ++i;
}

bool starts_at(std::string_view s, size_t i, std::string_view p) { return s.substr(i, p.size()) == p; }

// The schema of parameter `param` of tool `name` in an OpenAI tools array, or null.
const nlohmann::json* find_schema(const nlohmann::json& tools, const std::string& name, const std::string& param) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const nlohmann::json& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object()) continue;
    auto n = fn.find("name");  // a tool whose name is not a string cannot be the one called
    if (n == fn.end() || !n->is_string() || n->get_ref<const std::string&>() != name) continue;
    auto p = fn.find("parameters");
    if (p == fn.end() || !p->is_object()) return nullptr;
    auto props = p->find("properties");
    if (props == p->end() || !props->is_object()) return nullptr;
    auto s = props->find(param);
    return s == props->end() ? nullptr : &*s;
  }
  return nullptr;
}

// The JSON-schema types a value may have ("type" as a string or list, and the types of anyOf/oneOf branches).
std::set<std::string> schema_types(const nlohmann::json& schema) {
  std::set<std::string> out;
  if (!schema.is_object()) return out;
  auto add = [&](const nlohmann::json& t) {
    if (t.is_string()) out.insert(t.get<std::string>());
    if (t.is_array())
      for (const auto& x : t)
        if (x.is_string()) out.insert(x.get<std::string>());
  };
  if (schema.contains("type")) add(schema["type"]);
  for (const char* k : {"anyOf", "oneOf"})
    if (schema.contains(k) && schema[k].is_array())
      for (const auto& b : schema[k])
        if (b.is_object() && b.contains("type")) add(b["type"]);
  if (out.empty() && schema.contains("enum")) out.insert("string");
  return out;
}

bool has_any(const std::set<std::string>& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s.count(n)) return true;
  return false;
}

std::optional<ojson> parse_number(std::string_view text, bool integer_only) {
  std::string t(py::strip(text));
  if (t.empty()) return std::nullopt;
  ojson v = ojson::parse(t, nullptr, false);
  if (v.is_discarded() || !v.is_number()) return std::nullopt;
  if (integer_only && !v.is_number_integer() && !v.is_number_unsigned()) {
    const double d = v.get<double>();
    if (std::floor(d) != d || std::fabs(d) > 9.0e15) return std::nullopt;
    return ojson(int64_t(d));
  }
  // A float that is a whole number becomes an integer ("3.0" -> 3), as the reference parsers do.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) return ojson(int64_t(d));
  }
  return v;
}

// --- Python literals -----------------------------------------------------------------------------------------
struct PyParser {
  std::string_view s;
  size_t i = 0;
  int depth = 0;

  void ws() {
    while (i < s.size() && (is_ws(s[i]))) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool word(std::string_view w) {
    ws();
    if (s.substr(i, w.size()) != w) return false;
    const size_t e = i + w.size();
    if (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) return false;
    i = e;
    return true;
  }
  std::optional<std::string> str() {
    ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return std::nullopt;
    const char q = s[i++];
    std::string out;
    while (i < s.size() && s[i] != q) {
      char c = s[i++];
      if (c == '\n') return std::nullopt;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i >= s.size()) return std::nullopt;
      c = s[i++];
      switch (c) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '0': out.push_back('\0'); break;
        case '\\': case '\'': case '"': out.push_back(c); break;
        case 'u': {
          if (i + 4 > s.size()) return std::nullopt;
          uint32_t cp = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = s[i++];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return std::nullopt;
            cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) return std::nullopt;
          utf8::append(out, cp);
          break;
        }
        default: out.push_back('\\'); out.push_back(c);
      }
    }
    if (i >= s.size()) return std::nullopt;
    ++i;
    return out;
  }
  std::optional<ojson> value() {
    if (++depth > 64) return std::nullopt;
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } g{depth};
    ws();
    if (i >= s.size()) return std::nullopt;
    const char c = s[i];
    if (c == '{') {
      ++i;
      ojson obj = ojson::object();
      if (eat('}')) return obj;
      do {
        if (eat('}')) return obj;  // trailing comma
        auto k = str();
        if (!k || !eat(':')) return std::nullopt;
        auto v = value();
        if (!v) return std::nullopt;
        obj[*k] = std::move(*v);
      } while (eat(','));
      if (!eat('}')) return std::nullopt;
      return obj;
    }
    if (c == '[' || c == '(') {
      const char close = c == '[' ? ']' : ')';
      ++i;
      ojson arr = ojson::array();
      if (eat(close)) return arr;
      do {
        if (eat(close)) return arr;
        auto v = value();
        if (!v) return std::nullopt;
        arr.push_back(std::move(*v));
      } while (eat(','));
      if (!eat(close)) return std::nullopt;
      return arr;
    }
    if (c == '\'' || c == '"') {
      auto x = str();
      if (!x) return std::nullopt;
      return ojson(*x);
    }
    if (word("True")) return ojson(true);
    if (word("False")) return ojson(false);
    if (word("None")) return ojson(nullptr);
    size_t e = i;
    while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '.' || s[e] == '-' ||
                            s[e] == '+'))
      ++e;
    auto num = parse_number(s.substr(i, e - i), false);
    if (!num) return std::nullopt;
    i = e;
    return num;
  }
};

}  // namespace

std::optional<ojson> parse_python_literal(std::string_view text) {
  PyParser p{text};
  auto v = p.value();
  p.ws();
  if (!v || p.i != text.size()) return std::nullopt;
  return v;
}

ojson convert_parameter(const std::string& raw, const nlohmann::json* schema) {
  if (!schema) return ojson(raw);
  const auto types = schema_types(*schema);
  const std::string t(py::strip(raw));
  const bool stringy = types.empty() || has_any(types, {"string", "str", "text", "varchar", "char", "enum"});
  if ((t == "null" || t == "None") && (types.count("null") || !stringy)) return ojson(nullptr);
  if (stringy && !has_any(types, {"integer", "int", "number", "float", "boolean", "bool", "object", "array"}))
    return ojson(raw);
  if (has_any(types, {"integer", "int"}))
    if (auto v = parse_number(t, true)) return *v;
  if (has_any(types, {"number", "float"}))
    if (auto v = parse_number(t, false)) return *v;
  if (has_any(types, {"boolean", "bool"})) {
    if (t == "true" || t == "True") return ojson(true);
    if (t == "false" || t == "False") return ojson(false);
  }
  if (has_any(types, {"object", "array", "dict", "list"})) {
    ojson v = ojson::parse(t, nullptr, false);
    if (!v.is_discarded() && (v.is_object() || v.is_array())) return v;
    if (auto p = parse_python_literal(t); p && (p->is_object() || p->is_array())) return *p;
  }
  return ojson(raw);  // the value does not fit its schema: keep what the model wrote
}

std::optional<XmlToolCall> parse_xml_tool_call(std::string_view block, const nlohmann::json& tools,
                                               std::string* why) {
  auto bad = [&](std::string reason) -> std::optional<XmlToolCall> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  if (block.substr(0, kOpen.size()) != kOpen || block.size() < kOpen.size() + kClose.size() ||
      block.substr(block.size() - kClose.size()) != kClose)
    return bad("not enclosed in <tool_call></tool_call>");
  std::string_view s = block.substr(kOpen.size(), block.size() - kOpen.size() - kClose.size());
  size_t i = 0;
  skip_ws(s, i);
  if (!starts_at(s, i, "<function=")) return bad("no <function=...> after <tool_call>");
  i += 10;
  const size_t name_end = s.find('>', i);
  if (name_end == std::string_view::npos) return bad("unterminated <function=");
  XmlToolCall call;
  call.name = std::string(py::strip(s.substr(i, name_end - i)));
  if (call.name.empty() || call.name.find_first_of("<\n") != std::string::npos) return bad("bad function name");
  i = name_end + 1;
  call.arguments = ojson::object();
  while (true) {
    skip_ws(s, i);
    if (i >= s.size()) break;  // "</function>" missing: accepted when nothing else follows
    if (starts_at(s, i, "</function>")) {
      i += 11;
      skip_ws(s, i);
      if (i != s.size()) return bad("text after </function>");
      break;
    }
    if (!starts_at(s, i, "<parameter=")) return bad("expected <parameter=...> or </function>");
    i += 11;
    const size_t pend = s.find('>', i);
    if (pend == std::string_view::npos) return bad("unterminated <parameter=");
    const std::string pname(py::strip(s.substr(i, pend - i)));
    if (pname.empty() || pname.find_first_of("<\n") != std::string::npos) return bad("bad parameter name");
    i = pend + 1;
    size_t vend = s.find("</parameter>", i), next = vend;
    if (vend != std::string_view::npos) {
      next = vend + 12;
    } else {  // a missing </parameter>: the value runs to the next parameter or the end of the function
      vend = std::min(s.find("<parameter=", i), s.find("</function>", i));
      if (vend == std::string_view::npos) vend = s.size();
      next = vend;
    }
    std::string_view v = s.substr(i, vend - i);
    // Exactly one newline on each side belongs to the format, not to the value.
    if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
    if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
    call.arguments[pname] = convert_parameter(std::string(v), find_schema(tools, call.name, pname));
    i = next;
  }
  return call;
}

}  // namespace fern
