#include "tokenizer/py_format.h"

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace fern::py {
namespace {

void dump_string(const std::string& s, std::string& out) {
  if (!utf8::valid(s)) fail("string is not valid UTF-8");
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out.push_back(char(c));
    }
  }
  out.push_back('"');
}

void dump(const nlohmann::ordered_json& v, std::string& out, int depth) {
  if (depth > 256) fail("JSON value nested too deeply");
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null: out += "null"; break;
    case T::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case T::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case T::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case T::number_float: {
      const double d = v.get<double>();
      // Python writes NaN / Infinity for these (not valid JSON, but what json.dumps produces).
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(d);
      break;
    }
    case T::string: dump_string(v.get_ref<const std::string&>(), out); break;
    case T::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(e, out, depth + 1);
      }
      out.push_back(']');
      break;
    }
    case T::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dump(it.value(), out, depth + 1);
      }
      out.push_back('}');
      break;
    }
    default: fail("unsupported JSON value (binary)");
  }
}

}  // namespace

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // shortest round-trip digits: "-1.2345e+05"
  const bool neg = sci[0] == '-';
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(neg ? 1 : 0, epos - (neg ? 1 : 0));
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {  // Python's repr switches to exponent form here
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1);
    }
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (exp < 0) {
    out += "0.";
    out.append(size_t(-exp - 1), '0');
    out += digits;
  } else {
    const size_t ip = size_t(exp) + 1;
    if (digits.size() <= ip) {
      out += digits;
      out.append(ip - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, ip);
      out.push_back('.');
      out.append(digits, ip);
    }
  }
  return out;
}

std::string dumps(const nlohmann::ordered_json& v) {
  std::string out;
  dump(v, out, 0);
  return out;
}

std::string str(const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::string: return v.get<std::string>();
    case T::null: return "None";
    case T::boolean: return v.get<bool>() ? "True" : "False";
    case T::number_float: return float_repr(v.get<double>());
    default: return dumps(v);
  }
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string_view strip(std::string_view s) {
  auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t b = 0, e = s.size();
  while (b < e) {
    utf8::Seq q = utf8::next(p + b, e - b);
    if (q.status != utf8::SeqStatus::Valid || !is_space(q.cp)) break;
    b += q.len;
  }
  while (e > b) {
    size_t i = e - 1;
    while (i > b && (p[i] & 0xC0) == 0x80) --i;
    utf8::Seq q = utf8::next(p + i, e - i);
    if (q.status != utf8::SeqStatus::Valid || q.len != e - i || !is_space(q.cp)) break;
    e = i;
  }
  return s.substr(b, e - b);
}

std::string_view strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && chars.find(s[b]) != std::string_view::npos) ++b;
  if (right)
    while (e > b && chars.find(s[e - 1]) != std::string_view::npos) --e;
  return s.substr(b, e - b);
}

}  // namespace fern::py
