// Structured output (`response_format` json_object / json_schema): a JSON Schema subset compiled into nodes, and a
// matcher that follows a JSON text byte by byte and says which continuations keep it valid, so that the generator
// only lets the model write tokens that keep the reply a prefix of a conforming JSON value.
//
// Supported: `type` (a name or a list: object, array, string, number, integer, boolean, null), `properties`,
// `required`, `additionalProperties` (true, false or a schema), `items`, `minItems` / `maxItems`, `minLength` /
// `maxLength`, `enum` and `const` of scalars, `anyOf` / `oneOf` whose branches start differently (e.g. a type and
// null), `allOf` of one schema, `$ref` into `$defs` / `definitions` (recursion included). Keywords that only narrow
// values further (`pattern`, `format`, `minimum`, `maximum`, ...) are accepted and not enforced; anything that would
// change the structure (`prefixItems`, `patternProperties`, `not`, `if`, overlapping `anyOf` branches, ...) is an
// error, so that a schema is never silently ignored.
#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fern {

class JsonSchema {
 public:
  enum Type : uint8_t {
    kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64, kAny = 127
  };
  struct Node {
    uint8_t types = kAny;
    // object
    std::vector<std::string> keys;  // declared properties (at most 64), raw names
    std::vector<int> key_nodes;
    uint64_t required = 0;          // bit i: keys[i] is required
    int additional = 0;             // node of undeclared keys' values; -1: no undeclared keys
    // array
    int items = 0;
    int64_t min_items = 0, max_items = -1;
    // string
    int64_t min_length = 0, max_length = -1;
    // enum / const: the allowed values as compact JSON texts (at most 64)
    std::vector<std::string> enums;
  };

  // Any JSON object (json_object mode).
  static std::shared_ptr<const JsonSchema> any_object();
  // Throws fern::Error naming the unsupported or malformed part.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);

  const Node& node(int i) const { return nodes_[size_t(i)]; }
  int root() const { return root_; }

 private:
  std::vector<Node> nodes_;  // node 0 is "any value"
  int root_ = 0;
  friend class SchemaCompiler;
};

// Follows a JSON text against a schema. Whitespace between tokens is allowed up to 64 bytes in a row, numbers up to
// 24 digits (exponents up to 2), nesting up to 32 levels, so that a constrained model cannot loop forever inside one
// of them and every number fits a double. Strings must be valid UTF-8 (RFC 3629).
class JsonMatcher {
 public:
  // allow_tool_call: the text may instead start with "<tool_call>" (a model answering with a tool call when tools
  // were offered), after which nothing is constrained.
  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema, bool allow_tool_call = false);

  // Feeds bytes; false (and the state unchanged) when some byte would break the text.
  bool feed(std::string_view bytes);
  // Whether feed(bytes) would succeed; the state is unchanged either way.
  bool accepts(std::string_view bytes) const;
  // The text read so far is a whole value (the reply may end here).
  bool complete() const;
  // A tool call started: everything is accepted from here on.
  bool unconstrained() const { return free_; }
  // Inside a string whose contents are free (no enum, no key, no length bound) and between characters: any whole
  // UTF-8 characters without '"', '\\' or control characters are accepted (the token mask's fast path).
  bool in_free_string() const;

 private:
  enum class Kind : uint8_t { Value, Object, Array, String, Number, Literal, Enum, ToolTag };
  struct Frame {
    Kind kind = Kind::Value;
    uint8_t sub = 0;      // the kind's own state
    bool flag = false;    // String: after a backslash; Number: integer only
    uint8_t hex = 0;      // String: \u digits left
    int32_t node = 0;
    int32_t ws = 0;       // whitespace bytes in a row
    int64_t count = 0;    // Array: items; String: characters; Number: digits; Literal/Enum/ToolTag: bytes matched
    uint64_t bits = 0;    // Object: keys seen; Enum: candidates still matching
    uint64_t cand = 0;    // Object: declared keys matching the key typed so far
    int32_t key_len = 0;  // Object: bytes of the key typed so far; Number: exponent digits
    int32_t cur = -1;     // Object: the key whose value comes next (-2: an undeclared key)
    const char* lit = nullptr;  // Literal: "true" / "false" / "null"
    uint8_t u8_left = 0;        // String and Object keys: UTF-8 continuation bytes still due
    uint8_t u8_lo = 0x80, u8_hi = 0xBF;  // the range of the next one (RFC 3629: no overlongs, no surrogates)
  };
  static constexpr int kMaxDepth = 32;

  bool step(uint8_t c);
  bool start_value(Frame& f, uint8_t c);  // f is a Value frame; c its first non-whitespace byte
  bool push(const Frame& f);
  bool pop_and_refeed(uint8_t c);         // the top frame is complete: pop it, then give c to its parent
  void child_done();                      // the top frame ended: pop it and move its parent on
  bool completeable(const Frame& f) const;
  void copy_from(const JsonMatcher& o);

  std::shared_ptr<const JsonSchema> schema_;
  bool allow_tool_call_ = false;
  bool done_ = false;   // the top-level value ended
  bool free_ = false;   // a tool call started
  int32_t tail_ws_ = 0;
  int depth_ = 0;
  std::array<Frame, kMaxDepth> stack_{};
  mutable std::unique_ptr<JsonMatcher> scratch_;  // accepts() works on it
};

// One byte of UTF-8 (RFC 3629): 0 refused, 1 a continuation byte, 2 the first byte of a character. `left`, `lo`,
// `hi` carry the continuation bytes still due and the range of the next (start at 0, 0x80, 0xBF).
int utf8_step(uint8_t& left, uint8_t& lo, uint8_t& hi, uint8_t c);

}  // namespace fern
