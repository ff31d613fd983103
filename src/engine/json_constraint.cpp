#include "engine/json_constraint.h"

#include <cstring>
#include <map>
#include <set>

#include "core/error.h"

namespace fern {

namespace {

constexpr size_t kMaxProps = 64, kMaxEnums = 64, kMaxNodes = 4096;
constexpr int32_t kMaxWs = 64;
constexpr int64_t kMaxDigits = 24;
constexpr int32_t kMaxFreeKey = 256;
constexpr const char* kToolTag = "<tool_call>";

bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

// One byte of UTF-8 text inside a string or key (RFC 3629 ranges): 0 refused, 1 a continuation byte, 2 the first
// byte of a character (ASCII or a lead byte).
int utf8_step(uint8_t& left, uint8_t& lo, uint8_t& hi, uint8_t c) {
  if (left > 0) {
    if (c < lo || c > hi) return 0;
    --left;
    lo = 0x80;
    hi = 0xBF;
    return 1;
  }
  if (c < 0x80) return 2;
  lo = 0x80;
  hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) left = 1;
  else if (c == 0xE0) left = 2, lo = 0xA0;
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) left = 2;
  else if (c == 0xED) left = 2, hi = 0x9F;
  else if (c == 0xF0) left = 3, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) left = 3;
  else if (c == 0xF4) left = 3, hi = 0x8F;
  else return 0;
  return 2;
}

namespace {

// Keywords that only narrow the values of a type the matcher already enforces: accepted, not enforced.
const std::set<std::string> kIgnored = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs", "definitions", "strict",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "uniqueItems", "minProperties", "maxProperties", "readOnly", "writeOnly", "deprecated", "contentEncoding",
    "contentMediaType", "name", "discriminator", "nullable"};

}  // namespace

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const nlohmann::json& root) : root_(root) {}

  std::shared_ptr<const JsonSchema> run() {
    auto s = std::make_shared<JsonSchema>();
    out_ = s.get();
    out_->nodes_.emplace_back();  // 0: any value
    out_->root_ = compile(root_, "schema");
    return s;
  }

 private:
  int new_node() {
    if (out_->nodes_.size() >= kMaxNodes) fail("the schema has more than {} parts", kMaxNodes);
    out_->nodes_.emplace_back();
    return int(out_->nodes_.size() - 1);
  }

  const nlohmann::json& resolve_ref(const std::string& ref, const std::string& where) {
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) == 0) {
        const std::string name = ref.substr(p.size());
        const std::string group = p.substr(2, p.size() - 3);
        if (root_.contains(group) && root_[group].is_object() && root_[group].contains(name))
          return root_[group][name];
        fail("{}: $ref '{}' names no definition", where, ref.substr(0, 200));
      }
    }
    if (ref == "#") return root_;
    fail("{}: $ref '{}' is not supported (only #/$defs/... and #/definitions/...)", where, ref.substr(0, 200));
  }

  static std::string scalar_text(const nlohmann::json& v, const std::string& where) {
    if (v.is_object() || v.is_array()) fail("{}: enum and const values must be strings, numbers, booleans or null", where);
    return v.dump();
  }

  // Fills node `id` from schema `s` (refs resolved by the caller).
  void fill(int id, const nlohmann::json& s, const std::string& where) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("{}: the schema false allows no value", where);
      out_->nodes_[size_t(id)].types = JsonSchema::kAny;
      return;
    }
    if (!s.is_object()) fail("{}: a schema must be an object", where);
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      static const std::set<std::string> known = {"type", "properties", "required", "additionalProperties", "items",
                                                  "minItems", "maxItems", "minLength", "maxLength", "enum", "const",
                                                  "anyOf", "oneOf", "allOf", "$ref"};
      if (!known.count(k) && !kIgnored.count(k)) fail("{}: the keyword '{}' is not supported", where, k.substr(0, 100));
    }
    if (s.contains("$ref")) {
      if (s.size() > 1) {
        // Siblings of $ref other than annotations would need merging.
        for (auto it = s.begin(); it != s.end(); ++it)
          if (it.key() != "$ref" && !kIgnored.count(it.key()))
            fail("{}: '{}' beside $ref is not supported", where, it.key());
      }
      if (!s["$ref"].is_string()) fail("{}.$ref must be a string", where);
      const std::string ref = s["$ref"].get<std::string>();
      const int target = compile(resolve_ref(ref, where), where + ".$ref");
      out_->nodes_[size_t(id)] = out_->nodes_[size_t(target)];
      return;
    }
    if (s.contains("allOf")) {
      const auto& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) fail("{}.allOf: only a list of one schema is supported", where);
      fill(id, a[0], where + ".allOf[0]");
      return;
    }
    for (const char* alt : {"anyOf", "oneOf"}) {
      if (!s.contains(alt)) continue;
      const auto& a = s[alt];
      if (!a.is_array() || a.empty()) fail("{}.{} must be a non-empty list", where, alt);
      // Branches must start differently: each type class (object, array, string, number, boolean, null) may come
      // from one branch only, which then gives its details.
      JsonSchema::Node merged;
      merged.types = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const int b = compile(a[i], fmt::format("{}.{}[{}]", where, alt, i));
        const JsonSchema::Node& bn = out_->nodes_[size_t(b)];
        if (!bn.enums.empty()) fail("{}.{}[{}]: enum inside {} is not supported", where, alt, i, alt);
        uint8_t t = bn.types;
        if (t & JsonSchema::kInteger) t |= JsonSchema::kNumber;  // both start with a digit or '-'
        uint8_t have = merged.types;
        if (have & JsonSchema::kInteger) have |= JsonSchema::kNumber;
        if (t & have) fail("{}.{}: branches {} overlap (two branches accept the same kind of value)", where, alt, i);
        merged.types |= bn.types;
        if (bn.types & JsonSchema::kObject) {
          merged.keys = bn.keys;
          merged.key_nodes = bn.key_nodes;
          merged.required = bn.required;
          merged.additional = bn.additional;
        }
        if (bn.types & JsonSchema::kArray) {
          merged.items = bn.items;
          merged.min_items = bn.min_items;
          merged.max_items = bn.max_items;
        }
        if (bn.types & JsonSchema::kString) {
          merged.min_length = bn.min_length;
          merged.max_length = bn.max_length;
        }
      }
      out_->nodes_[size_t(id)] = merged;
      return;
    }
    JsonSchema::Node n;
    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("const")) {
        n.enums.push_back(scalar_text(s["const"], where + ".const"));
      } else {
        const auto& e = s["enum"];
        if (!e.is_array() || e.empty()) fail("{}.enum must be a non-empty list", where);
        if (e.size() > kMaxEnums) fail("{}.enum: at most {} values are supported", where, kMaxEnums);
        std::set<std::string> seen;
        for (const auto& v : e) {
          std::string t = scalar_text(v, where + ".enum");
          if (seen.insert(t).second) n.enums.push_back(std::move(t));
        }
      }
      out_->nodes_[size_t(id)] = n;
      return;
    }
    n.types = 0;
    if (s.contains("type")) {
      std::vector<std::string> names;
      if (s["type"].is_string()) {
        names.push_back(s["type"].get<std::string>());
      } else if (s["type"].is_array()) {
        for (const auto& t : s["type"]) {
          if (!t.is_string()) fail("{}.type: a list of type names", where);
          names.push_back(t.get<std::string>());
        }
      } else {
        fail("{}.type must be a type name or a list of them", where);
      }
      for (const auto& t : names) {
        if (t == "object") n.types |= JsonSchema::kObject;
        else if (t == "array") n.types |= JsonSchema::kArray;
        else if (t == "string") n.types |= JsonSchema::kString;
        else if (t == "number") n.types |= JsonSchema::kNumber | JsonSchema::kInteger;
        else if (t == "integer") n.types |= JsonSchema::kInteger;
        else if (t == "boolean") n.types |= JsonSchema::kBoolean;
        else if (t == "null") n.types |= JsonSchema::kNull;
        else fail("{}.type: unknown type '{}'", where, t.substr(0, 100));
      }
      if (n.types == 0) fail("{}.type: an empty list allows no value", where);
    } else {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        n.types |= JsonSchema::kObject;
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) n.types |= JsonSchema::kArray;
      if (s.contains("minLength") || s.contains("maxLength")) n.types |= JsonSchema::kString;
      if (n.types == 0) n.types = JsonSchema::kAny;
    }
    auto get_count = [&](const char* key, int64_t dflt) -> int64_t {
      if (!s.contains(key)) return dflt;
      if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0)
        fail("{}.{} must be a non-negative integer", where, key);
      return s[key].get<int64_t>();
    };
    n.min_items = get_count("minItems", 0);
    n.max_items = get_count("maxItems", -1);
    n.min_length = get_count("minLength", 0);
    n.max_length = get_count("maxLength", -1);
    if (n.max_items >= 0 && n.max_items < n.min_items) fail("{}: maxItems is below minItems", where);
    if (n.max_length >= 0 && n.max_length < n.min_length) fail("{}: maxLength is below minLength", where);
    out_->nodes_[size_t(id)] = n;  // before the children: a recursive $ref may look at it

    if (s.contains("properties")) {
      const auto& props = s["properties"];
      if (!props.is_object()) fail("{}.properties must be an object", where);
      if (props.size() > kMaxProps) fail("{}.properties: at most {} properties are supported", where, kMaxProps);
      std::vector<std::string> keys;
      std::vector<int> key_nodes;
      for (auto it = props.begin(); it != props.end(); ++it) {
        for (unsigned char ch : it.key())
          if (ch < 0x20 || ch == '"' || ch == '\\')
            fail("{}.properties: property names with quotes, backslashes or control characters are not supported",
                 where);
        keys.push_back(it.key());
        key_nodes.push_back(compile(it.value(), where + ".properties." + it.key().substr(0, 100)));
      }
      out_->nodes_[size_t(id)].keys = std::move(keys);
      out_->nodes_[size_t(id)].key_nodes = std::move(key_nodes);
    }
    if (s.contains("required")) {
      const auto& req = s["required"];
      if (!req.is_array()) fail("{}.required must be a list of property names", where);
      JsonSchema::Node& m = out_->nodes_[size_t(id)];
      for (const auto& r : req) {
        if (!r.is_string()) fail("{}.required must be a list of property names", where);
        const auto k = std::find(m.keys.begin(), m.keys.end(), r.get<std::string>());
        if (k == m.keys.end())
          fail("{}.required: '{}' is not among the properties", where, r.get<std::string>().substr(0, 100));
        m.required |= uint64_t(1) << (k - m.keys.begin());
      }
    }
    if (s.contains("additionalProperties")) {
      const auto& ap = s["additionalProperties"];
      int add = 0;
      if (ap.is_boolean()) add = ap.get<bool>() ? 0 : -1;
      else add = compile(ap, where + ".additionalProperties");
      out_->nodes_[size_t(id)].additional = add;
    }
    if (s.contains("items")) {
      const int items = compile(s["items"], where + ".items");
      out_->nodes_[size_t(id)].items = items;
    }
  }

  int compile(const nlohmann::json& s, const std::string& where) {
    // A $ref target is compiled once (recursive schemas point back at their own node).
    if (s.is_object() && s.contains("$ref") && s["$ref"].is_string() && s.size() == 1) {
      const std::string ref = s["$ref"].get<std::string>();
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      const int id = new_node();
      refs_[ref] = id;
      fill(id, resolve_ref(ref, where), where + "($ref " + ref.substr(0, 100) + ")");
      return id;
    }
    if (++depth_ > 64) fail("{}: the schema is nested too deeply", where);
    const int id = new_node();
    fill(id, s, where);
    --depth_;
    return id;
  }

  const nlohmann::json& root_;
  JsonSchema* out_ = nullptr;
  std::map<std::string, int> refs_;
  int depth_ = 0;
};

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  auto s = std::make_shared<JsonSchema>();
  s->nodes_.emplace_back();  // any value
  JsonSchema::Node obj;
  obj.types = kObject;
  s->nodes_.push_back(obj);
  s->root_ = 1;
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::json& schema) {
  return SchemaCompiler(schema).run();
}

// ---- matcher ----

namespace {
enum : uint8_t { kObjStart, kObjKey, kObjColon, kObjValue, kObjAfterValue, kObjNextKey };
enum : uint8_t { kArrStart, kArrAfterValue, kArrNext };
enum : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema, bool allow_tool_call)
    : schema_(std::move(schema)), allow_tool_call_(allow_tool_call) {
  Frame f;
  f.kind = Kind::Value;
  f.node = schema_->root();
  stack_[0] = f;
  depth_ = 1;
}

void JsonMatcher::copy_from(const JsonMatcher& o) {
  schema_ = o.schema_;
  allow_tool_call_ = o.allow_tool_call_;
  done_ = o.done_;
  free_ = o.free_;
  tail_ws_ = o.tail_ws_;
  depth_ = o.depth_;
  std::copy(o.stack_.begin(), o.stack_.begin() + o.depth_, stack_.begin());
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  if (free_) return true;
  if (!scratch_) scratch_ = std::make_unique<JsonMatcher>(schema_, allow_tool_call_);
  scratch_->copy_from(*this);
  for (char c : bytes)
    if (!scratch_->step(static_cast<uint8_t>(c))) return false;
  return true;
}

bool JsonMatcher::feed(std::string_view bytes) {
  if (free_) return true;
  if (!accepts(bytes)) return false;
  copy_from(*scratch_);
  return true;
}

bool JsonMatcher::completeable(const Frame& f) const {
  if (f.kind == Kind::Number) return f.sub == kNumZero || f.sub == kNumInt || f.sub == kNumFrac || f.sub == kNumExp;
  if (f.kind == Kind::Enum) {
    const auto& enums = schema_->node(f.node).enums;
    for (size_t i = 0; i < enums.size(); ++i)
      if ((f.bits >> i & 1) && int64_t(enums[i].size()) == f.count) return true;
  }
  return false;
}

bool JsonMatcher::complete() const {
  if (free_ || done_) return true;
  return depth_ == 1 && completeable(stack_[0]);
}

bool JsonMatcher::in_free_string() const {
  if (free_ || done_ || depth_ == 0) return false;
  const Frame& f = stack_[size_t(depth_ - 1)];
  return f.kind == Kind::String && !f.flag && f.hex == 0 && f.bits == 0 && f.u8_left == 0 &&
         schema_->node(f.node).max_length < 0;
}

bool JsonMatcher::push(const Frame& f) {
  if (depth_ >= kMaxDepth) return false;
  stack_[size_t(depth_++)] = f;
  return true;
}

void JsonMatcher::child_done() {
  --depth_;
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& p = stack_[size_t(depth_ - 1)];
  p.ws = 0;
  if (p.kind == Kind::Object) p.sub = kObjAfterValue;
  else if (p.kind == Kind::Array) {
    p.sub = kArrAfterValue;
    p.count++;
  }
}

bool JsonMatcher::pop_and_refeed(uint8_t c) {
  child_done();
  return step(c);
}

bool JsonMatcher::start_value(Frame& f, uint8_t c) {
  const JsonSchema::Node& n = schema_->node(f.node);
  Frame g;
  g.node = f.node;
  if (!n.enums.empty()) {
    g.kind = Kind::Enum;
    g.bits = n.enums.size() >= 64 ? ~uint64_t(0) : (uint64_t(1) << n.enums.size()) - 1;
    g.count = 0;
    f = g;
    return step(c);  // the Enum frame takes c as its first byte
  }
  if (c == '{' && (n.types & JsonSchema::kObject)) {
    g.kind = Kind::Object;
    g.sub = kObjStart;
  } else if (c == '[' && (n.types & JsonSchema::kArray)) {
    g.kind = Kind::Array;
    g.sub = kArrStart;
  } else if (c == '"' && (n.types & JsonSchema::kString)) {
    g.kind = Kind::String;
  } else if ((c == '-' || is_digit(c)) && (n.types & (JsonSchema::kNumber | JsonSchema::kInteger))) {
    g.kind = Kind::Number;
    g.flag = !(n.types & JsonSchema::kNumber);  // integer only
    g.sub = c == '-' ? kNumMinus : (c == '0' ? kNumZero : kNumInt);
    g.count = c == '-' ? 0 : 1;
  } else if ((c == 't' || c == 'f') && (n.types & JsonSchema::kBoolean)) {
    g.kind = Kind::Literal;
    g.lit = c == 't' ? "true" : "false";
    g.count = 1;
  } else if (c == 'n' && (n.types & JsonSchema::kNull)) {
    g.kind = Kind::Literal;
    g.lit = "null";
    g.count = 1;
  } else {
    return false;
  }
  f = g;
  return true;
}

bool JsonMatcher::step(uint8_t c) {
  if (free_) return true;
  if (done_) {
    if (!is_ws(c) || ++tail_ws_ > kMaxWs) return false;
    return true;
  }
  Frame& f = stack_[size_t(depth_ - 1)];
  const JsonSchema::Node& n = schema_->node(f.node);
  switch (f.kind) {
    case Kind::Value: {
      if (is_ws(c)) return ++f.ws <= kMaxWs;
      if (c == '<' && allow_tool_call_ && depth_ == 1) {
        f.kind = Kind::ToolTag;
        f.count = 1;
        return true;
      }
      return start_value(f, c);
    }
    case Kind::ToolTag: {
      const size_t len = std::strlen(kToolTag);
      if (size_t(f.count) >= len || kToolTag[f.count] != char(c)) return false;
      if (size_t(++f.count) == len) free_ = true;
      return true;
    }
    case Kind::Literal: {
      if (f.lit[f.count] != char(c)) return false;
      if (f.lit[++f.count] == '\0') child_done();
      return true;
    }
    case Kind::Enum: {
      uint64_t next = 0;
      bool longer = false;
      for (size_t i = 0; i < n.enums.size(); ++i) {
        if (!(f.bits >> i & 1)) continue;
        const std::string& e = n.enums[i];
        if (int64_t(e.size()) > f.count && uint8_t(e[size_t(f.count)]) == c) {
          next |= uint64_t(1) << i;
          if (int64_t(e.size()) > f.count + 1) longer = true;
        }
      }
      if (next == 0) return completeable(f) ? pop_and_refeed(c) : false;
      f.bits = next;
      f.count++;
      if (!longer) child_done();  // every remaining candidate ends here: nothing can follow inside the value
      return true;
    }
    case Kind::String: {
      // \u escapes make UTF-16 code units: a high surrogate (D800-DBFF) must be followed by "\u" and a low one
      // (DC00-DFFF), a lone low one is refused, both digit by digit so that no accepted prefix is a dead end.
      // String frames keep the escape's value in `cand` and a pending high surrogate in `bits`.
      if (f.hex > 0) {
        if (!is_hex(c)) return false;
        const uint64_t d = is_digit(c) ? uint64_t(c - '0') : uint64_t((c | 0x20) - 'a' + 10);
        const int pos = 4 - f.hex;
        if (f.bits == 1) {
          if ((pos == 0 && d != 0xD) || (pos == 1 && d < 0xC)) return false;
        } else if (pos == 1 && f.cand == 0xD && d >= 0xC) {
          return false;
        }
        f.cand = f.cand * 16 + d;
        if (--f.hex == 0) {
          if (f.bits == 1) {
            f.bits = 0;
            f.count++;
          } else if (f.cand >= 0xD800 && f.cand <= 0xDBFF) {
            f.bits = 1;
          } else {
            f.count++;
          }
        }
        return true;
      }
      if (f.flag) {
        f.flag = false;
        if (c == 'u') {
          f.hex = 4;
          f.cand = 0;
          return true;
        }
        if (f.bits == 1 || c == 0 || !std::strchr("\"\\/bfnrt", c)) return false;
        f.count++;
        return true;
      }
      if (f.bits == 1) {  // after a high surrogate only "\u" may come
        if (c != '\\') return false;
        f.flag = true;
        return true;
      }
      if (f.u8_left > 0) return utf8_step(f.u8_left, f.u8_lo, f.u8_hi, c) != 0;
      if (c == '"') {
        if (f.count < n.min_length) return false;
        child_done();
        return true;
      }
      if (c < 0x20) return false;
      if (n.max_length >= 0 && f.count >= n.max_length) return false;
      if (c == '\\') {
        f.flag = true;
        return true;
      }
      if (utf8_step(f.u8_left, f.u8_lo, f.u8_hi, c) == 0) return false;
      f.count++;
      return true;
    }
    case Kind::Number: {
      const bool int_only = f.flag;
      auto digit = [&](uint8_t next) {
        if (++f.count > kMaxDigits) return false;
        f.sub = next;
        return true;
      };
      switch (f.sub) {
        case kNumMinus:
          if (c == '0') return digit(kNumZero);
          if (is_digit(c)) return digit(kNumInt);
          return false;
        case kNumZero:
        case kNumInt:
          if (f.sub == kNumInt && is_digit(c)) return digit(kNumInt);
          // '.' and 'e' need a digit after them: not at the digit limit (an accepted prefix is never a dead end).
          if (c == '.' && !int_only && f.count < kMaxDigits) {
            f.sub = kNumDot;
            return true;
          }
          if ((c == 'e' || c == 'E') && !int_only && f.count < kMaxDigits) {
            f.sub = kNumE;
            return true;
          }
          return pop_and_refeed(c);
        case kNumDot:
          return is_digit(c) && digit(kNumFrac);
        case kNumFrac:
          if (is_digit(c)) return digit(kNumFrac);
          if ((c == 'e' || c == 'E') && f.count < kMaxDigits) {
            f.sub = kNumE;
            return true;
          }
          return pop_and_refeed(c);
        // Exponents of at most two digits: every number then fits a double (JSON parsers refuse 2e400).
        case kNumE:
          if (c == '+' || c == '-') {
            f.sub = kNumESign;
            return true;
          }
          return is_digit(c) && ++f.key_len <= 2 && digit(kNumExp);
        case kNumESign:
          return is_digit(c) && ++f.key_len <= 2 && digit(kNumExp);
        case kNumExp:
          if (is_digit(c)) return ++f.key_len <= 2 && digit(kNumExp);
          return pop_and_refeed(c);
      }
      return false;
    }
    case Kind::Object: {
      const uint64_t unseen = (n.keys.size() >= 64 ? ~uint64_t(0) : (uint64_t(1) << n.keys.size()) - 1) & ~f.bits;
      const bool any_key = n.additional >= 0 || unseen != 0;
      const bool may_close = (n.required & ~f.bits) == 0;
      switch (f.sub) {
        case kObjStart:
        case kObjNextKey:
          if (is_ws(c)) return ++f.ws <= kMaxWs;
          if (c == '}' && f.sub == kObjStart && may_close) {
            child_done();
            return true;
          }
          if (c == '"' && any_key) {
            f.sub = kObjKey;
            f.cand = unseen;
            f.key_len = 0;
            f.ws = 0;
            return true;
          }
          return false;
        case kObjKey: {
          if (c == '"' && f.u8_left == 0) {
            int match = -1;
            for (size_t i = 0; i < n.keys.size(); ++i)
              if ((f.cand >> i & 1) && int32_t(n.keys[i].size()) == f.key_len) match = int(i);
            if (match >= 0) {
              f.cur = match;
              f.bits |= uint64_t(1) << match;
            } else if (n.additional >= 0) {
              f.cur = -2;
            } else {
              return false;
            }
            f.sub = kObjColon;
            f.ws = 0;
            return true;
          }
          const bool char_start = f.u8_left == 0;
          if (char_start && (c < 0x20 || c == '\\')) return false;
          uint64_t next = 0;
          for (size_t i = 0; i < n.keys.size(); ++i)
            if ((f.cand >> i & 1) && int32_t(n.keys[i].size()) > f.key_len && uint8_t(n.keys[i][size_t(f.key_len)]) == c)
              next |= uint64_t(1) << i;
          // An undeclared key may grow to kMaxFreeKey bytes; a character already begun may always be finished.
          if (next == 0 && (n.additional < 0 || (char_start && f.key_len >= kMaxFreeKey))) return false;
          if (utf8_step(f.u8_left, f.u8_lo, f.u8_hi, c) == 0) return false;
          f.cand = next;
          f.key_len++;
          return true;
        }
        case kObjColon:
          if (is_ws(c)) return ++f.ws <= kMaxWs;
          if (c != ':') return false;
          f.sub = kObjValue;
          {
            Frame v;
            v.kind = Kind::Value;
            v.node = f.cur >= 0 ? n.key_nodes[size_t(f.cur)] : n.additional;
            return push(v);
          }
        case kObjAfterValue:
          if (is_ws(c)) return ++f.ws <= kMaxWs;
          if (c == ',' && any_key) {
            f.sub = kObjNextKey;
            f.ws = 0;
            return true;
          }
          if (c == '}' && may_close) {
            child_done();
            return true;
          }
          return false;
        default:
          return false;  // kObjValue: the value frame above takes the bytes
      }
    }
    case Kind::Array: {
      const bool may_close = f.count >= n.min_items;
      const bool may_add = n.max_items < 0 || f.count < n.max_items;
      if (is_ws(c)) return ++f.ws <= kMaxWs;
      if (f.sub == kArrAfterValue) {
        if (c == ',' && may_add) {
          f.sub = kArrNext;
          f.ws = 0;
          return true;
        }
        if (c == ']' && may_close) {
          child_done();
          return true;
        }
        return false;
      }
      if (c == ']' && f.sub == kArrStart && may_close) {
        child_done();
        return true;
      }
      if (!may_add) return false;
      Frame v;
      v.kind = Kind::Value;
      v.node = n.items;
      if (!push(v)) return false;
      return step(c);
    }
  }
  return false;
}

}  // namespace fern
