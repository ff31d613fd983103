// fern-test-labels: parser
// Request validation (POST /v1/chat/completions and /v1/completions bodies): accepted shapes, every rejection a
// 400 ApiError naming the parameter, and random mutations of a valid body that must only ever produce a request
// or an ApiError (never another exception or a crash; CI runs this under ASan+UBSan).
#include <gtest/gtest.h>

#include <random>

#include "server/api_error.h"
#include "server/anthropic_request.h"
#include "server/request.h"
#include "server/responses_request.h"

namespace fern::server {
namespace {

RequestLimits limits() {
  RequestLimits l;
  l.vocab_size = 151936;
  return l;
}

ApiError reject(const std::string& body, bool chat = true) {
  try {
    parse_request(body, chat, limits());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.substr(0, 200);
  return ApiError(0, "", "");
}

TEST(Request, AcceptsAFullChatRequest) {
  const std::string body = R"({
    "model": "m", "stream": true, "stream_options": {"include_usage": true},
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false,
    "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
    "presence_penalty": 1.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 18446744073709551615,
    "stop": ["END", "STOP"], "logit_bias": {"100": -100, "7": 2.5}, "reasoning_effort": "none",
    "chat_template_kwargs": {"preserve_thinking": true}, "prompt_cache_key": "s1", "user": "u", "n": 1,
    "some_future_field": {"x": [1, 2, 3]}})";
  ApiRequest r = parse_request(body, true, limits());
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.messages[0]["role"], "system");  // developer is treated as system
  EXPECT_EQ(r.max_tokens, 7);                   // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_EQ(*r.sampling.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.tool_choice, ToolChoice::Named);
  EXPECT_EQ(r.named_tool, "f");
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
  EXPECT_TRUE(r.preserve_thinking);
  EXPECT_EQ(r.cache_key, "s1");
  EXPECT_FALSE(r.forced_output.has_value());  // only with the start-up flag
}

TEST(Request, DefaultsAndCompletionsPrompts) {
  ApiRequest r = parse_request(R"({"messages":[{"role":"user","content":"x"}]})", true, limits());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
  ApiRequest t = parse_request(R"({"messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"g"}}]})", true, limits());
  EXPECT_EQ(t.tool_choice, ToolChoice::Auto);  // auto by default when tools are given
  EXPECT_EQ(r.top_logprobs, -1);
  const char* lp = R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":5})";
  EXPECT_EQ(parse_request(lp, true, limits()).top_logprobs, 5);
  EXPECT_EQ(parse_request(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", true, limits()).top_logprobs,
            0);
  // top_logprobs alone is validated and ignored, as before; logprobs false or 0 is no logprobs.
  EXPECT_EQ(parse_request(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", true, limits()).top_logprobs,
            -1);
  EXPECT_EQ(parse_request(R"({"prompt":"x","logprobs":0})", false, limits()).top_logprobs, -1);
  EXPECT_EQ(r.json_schema, nullptr);
  EXPECT_NE(parse_request(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
                          true, limits()).json_schema,
            nullptr);
  EXPECT_NE(parse_request(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
                             "json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{}}}}})",
                          true, limits()).json_schema,
            nullptr);
  EXPECT_EQ(parse_request(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})", true,
                          limits()).json_schema,
            nullptr);
  ApiRequest c = parse_request(R"({"prompt":"Once"})", false, limits());
  EXPECT_EQ(c.prompt, "Once");
  ApiRequest ids = parse_request(R"({"prompt":[1,2,3]})", false, limits());
  EXPECT_TRUE(ids.prompt_is_tokens);
  EXPECT_EQ(ids.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  RequestLimits l = limits();
  l.allow_forced_output = true;
  ApiRequest f = parse_request(R"({"prompt":"x","test_forced_output":"y"})", false, l);
  EXPECT_EQ(f.forced_output, std::optional<std::string>("y"));
}

TEST(Request, RejectionsNameTheParameter) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages":"x"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"assistant"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2.5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":2.5})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_k":-2})", "top_k"},
      {R"({"messages":[{"role":"user","content":"x"}],"min_p":1.5})", "min_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"repetition_penalty":0})", "repetition_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":3})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":-1})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":1.5})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"abc":1}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"151936":1}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":"yes"})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})", "response_format.type"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{}}})",
       "response_format.json_schema.schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
          "json_schema":{"schema":{"type":"object","patternProperties":{}}}}})",
       "response_format.json_schema.schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":2})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}})",
       "stream_options.include_usage"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]})",
       "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":7})", "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"prompt_cache_key":[]})", "prompt_cache_key"},
  };
  for (const auto& [body, param] : cases) {
    ApiError e = reject(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error") << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_GT(std::string(e.what()).size(), 10u) << body;
  }
  EXPECT_EQ(reject(R"({"prompt":[1,151936]})", false).param, "prompt");
  EXPECT_EQ(reject(R"({"prompt":"x","echo":true})", false).param, "echo");
  EXPECT_EQ(reject(R"({"prompt":"x","logprobs":2})", false).param, "logprobs");  // the older form is not offered
}

TEST(Request, MalformedBodiesAndDepthLimit) {
  for (const std::string& body : std::vector<std::string>{"", "{", "[]", "42", "null", "\"x\"", "{\"a\":NaN}", "{\"a\":1} x",
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
                                 std::string("{\"m\":\"\xff\"}")}) {
    ApiError e = reject(body);
    EXPECT_EQ(e.status, 400) << body;
  }
  EXPECT_EQ(json_nesting_depth(R"({"a":[{"b":"[[[[["}]})"), 3);  // brackets inside strings do not count
  EXPECT_EQ(json_nesting_depth(R"({"a":"\"[[["})"), 1);
  std::string deep(100000, '[');
  ApiError e = reject(deep);
  EXPECT_NE(std::string(e.what()).find("nested deeper"), std::string::npos);
  std::string ok_depth = R"({"messages":[{"role":"user","content":"x"}],"x":)" + std::string(60, '[') +
                         std::string(60, ']') + "}";
  EXPECT_NO_THROW(parse_request(ok_depth, true, limits()));
}

TEST(Request, ParseErrorsDoNotEchoRequestBytes) {
  ApiError e = reject(std::string("{\"messages\": \xff\xfe secret"));
  EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos);
  EXPECT_NO_THROW(dump_json(error_json(e)));
}

// Random byte flips, truncations and splices of a valid body: the parser returns or throws ApiError, nothing else.
TEST(Request, MutatedBodiesOnlyEverGiveApiErrors) {
  const std::string seed_body =
      R"({"model":"m","messages":[{"role":"user","content":"Hello"},{"role":"assistant","content":null,)"
      R"("tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":[1,2]}"}}]},)"
      R"({"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[{"type":"function","function":{"name":"f",)"
      R"("parameters":{"type":"object"}}}],"temperature":0.7,"stop":["x"],"logit_bias":{"5":1},"max_tokens":9,)"
      R"("response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{)"
      R"("a":{"type":"array","items":{"$ref":"#/$defs/d"}}},"$defs":{"d":{"enum":[1,"x"]}}}}}})";
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":,0123456789-.eE truefalsn\\u\xff";
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string b = seed_body;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: b.erase(pos, 1 + rng() % 8); break;
        case 2: b = b.substr(0, pos) + alphabet[rng() % alphabet.size()] + b.substr(pos); break;
        default: b.resize(pos); break;
      }
      if (b.empty()) b.push_back('{');
    }
    try {
      parse_request(b, (i & 1) == 0, limits());
      ++accepted;
    } catch (const ApiError& e) {
      ++rejected;
      ASSERT_EQ(e.status, 400);
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(accepted, 10);
}

}  // namespace
// The Anthropic Messages request becomes the chat request: system first, tool calls on the assistant message, each
// tool_result a tool message before the user's text, tools and tool_choice mapped, thinking off unless enabled.
TEST(Request, AnthropicMessagesBecomeChatRequests) {
  const auto a = nlohmann::ordered_json::parse(R"({"model":"claude-x","max_tokens":7,"system":[{"type":"text","text":"S"}],
    "messages":[{"role":"user","content":"Q"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"T"},{"type":"text","text":"A"},
        {"type":"tool_use","id":"t1","name":"f","input":{"z":1,"a":2}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"R"}],
        "is_error":true},{"type":"text","text":"U"}]}],
    "tools":[{"name":"f","description":"d","input_schema":{"type":"object","properties":{"z":{},"a":{}}}}],
    "tool_choice":{"type":"any","disable_parallel_tool_use":true},"stop_sequences":["x"],"temperature":0.5})");
  const auto c = chat_from_anthropic(a);
  EXPECT_EQ(c["messages"].dump(),
            R"([{"role":"system","content":"S"},{"role":"user","content":"Q"},{"role":"assistant","content":"A",)"
            R"("reasoning_content":"T","tool_calls":[{"id":"t1","type":"function","function":{"name":"f",)"
            R"("arguments":"{\"z\":1,\"a\":2}"}}]},{"role":"tool","tool_call_id":"t1","content":"Error: R"},)"
            R"({"role":"user","content":"U"}])");
  EXPECT_EQ(c["tools"][0]["function"]["parameters"]["properties"].dump(), R"({"z":{},"a":{}})");  // key order kept
  EXPECT_EQ(c["tool_choice"], "required");
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["stop"][0], "x");
  EXPECT_EQ(c["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_FALSE(c.contains("model"));
  const ApiRequest r = parse_request(c.dump(), true, limits());
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.tool_choice, ToolChoice::Required);
  for (const char* bad : {R"({"messages":[{"role":"user","content":"Q"}]})",                       // no max_tokens
                          R"({"max_tokens":5,"messages":[]})",
                          R"({"max_tokens":5,"messages":[{"role":"system","content":"Q"}]})",
                          R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]})",
                          R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":7}]}]})",
                          R"({"max_tokens":5,"messages":[{"role":"user","content":"Q"}],"tools":[{"type":"bash_20250124"}]})",
                          R"({"max_tokens":5,"messages":[{"role":"user","content":"Q"}],"tool_choice":{"type":3}})"}) {
    try {
      chat_from_anthropic(nlohmann::ordered_json::parse(bad));
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << bad;
    }
  }
}

// A random mutation of `seed`: one to four byte flips, deletions or insertions.
std::string mutate(const std::string& seed, std::mt19937& rng) {
  static const std::string alphabet = "{}[]\":,0123456789-.eE truefalsn\\u\xff";
  std::string b = seed;
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < edits; ++k) {
    const size_t pos = rng() % b.size();
    switch (rng() % 3) {
      case 0: b[pos] = alphabet[rng() % alphabet.size()]; break;
      case 1: b.erase(pos, 1 + rng() % 8); break;
      default: b = b.substr(0, pos) + alphabet[rng() % alphabet.size()] + b.substr(pos); break;
    }
    if (b.empty()) b.push_back('{');
  }
  return b;
}

// 20k mutations of a body that parse as JSON go through `translate` and the chat request's parser: only ApiError
// 400 may come out. Returns how many were accepted.
int accepted_mutations(const std::string& seed, uint32_t rng_seed,
                       nlohmann::ordered_json (*translate)(const nlohmann::ordered_json&)) {
  std::mt19937 rng(rng_seed);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const auto j = nlohmann::ordered_json::parse(mutate(seed, rng), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    try {
      parse_request(translate(j).dump(), true, limits());
      ++accepted;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
    }
  }
  return accepted;
}

// Random mutations of an Anthropic body: translation and parsing return or throw ApiError 400, nothing else.
TEST(Request, MutatedAnthropicBodiesOnlyEverGiveApiErrors) {
  const std::string seed_body =
      R"({"model":"m","max_tokens":9,"system":"S","messages":[{"role":"user","content":"Hi"},{"role":"assistant",)"
      R"("content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t","name":"f","input":{"q":[1]}}]},)"
      R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok","is_error":false}]}],)"
      R"("tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"},)"
      R"("thinking":{"type":"enabled","budget_tokens":9},"stop_sequences":["x"]})";
  EXPECT_GT(accepted_mutations(seed_body, 77, [](const nlohmann::ordered_json& j) { return chat_from_anthropic(j); }),
            100);
}

// The Responses request becomes the chat request: instructions first, the stored conversation, a reasoning item
// and function calls on one assistant message, their outputs as tool messages, text.format as response_format.
TEST(Request, ResponsesRequestsBecomeChatRequests) {
  const auto history = nlohmann::ordered_json::parse(R"([{"role":"user","content":"Before"}])");
  const auto r = nlohmann::ordered_json::parse(R"({"model":"m","instructions":"I","max_output_tokens":9,"input":[
      {"role":"user","content":[{"type":"input_text","text":"Q"}]},
      {"type":"reasoning","summary":[{"type":"summary_text","text":"R"}]},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1}"},
      {"type":"function_call_output","call_id":"c1","output":"out"}],
    "tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},
    "text":{"format":{"type":"json_object"}},"reasoning":{"effort":"none"}})");
  const auto c = chat_from_responses(r, &history);
  EXPECT_EQ(c["messages"].dump(),
            R"([{"role":"system","content":"I"},{"role":"user","content":"Before"},{"role":"user","content":"Q"},)"
            R"({"role":"assistant","content":null,"reasoning_content":"R","tool_calls":[{"id":"c1","type":"function",)"
            R"("function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"out"}])");
  EXPECT_EQ(c["max_tokens"], 9);
  EXPECT_EQ(c["response_format"]["type"], "json_object");
  EXPECT_EQ(c["reasoning_effort"], "none");
  const ApiRequest a = parse_request(c.dump(), true, limits());
  EXPECT_EQ(a.tool_choice, ToolChoice::Named);
  EXPECT_NE(a.json_schema, nullptr);
  for (const char* bad : {R"({"input":7})", R"({"model":"m"})", R"({"input":[{"type":"web_search_call"}]})",
                          R"({"input":"x","tools":[{"type":"file_search"}]})",
                          R"({"input":[{"type":"function_call","call_id":1}]})",
                          R"({"input":"x","text":{"format":{"type":"yaml"}}})"}) {
    try {
      chat_from_responses(nlohmann::ordered_json::parse(bad), nullptr);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << bad;
    }
  }
}

// Random mutations of a Responses body: translation and parsing return or throw ApiError 400, nothing else.
TEST(Request, MutatedResponsesBodiesOnlyEverGiveApiErrors) {
  const std::string seed_body =
      R"({"model":"m","instructions":"I","max_output_tokens":9,"input":[{"role":"user","content":"Hi"},)"
      R"({"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output",)"
      R"("call_id":"c","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],)"
      R"("text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}},"reasoning":{"effort":"low"}})";
  EXPECT_GT(accepted_mutations(seed_body, 99,
                               [](const nlohmann::ordered_json& j) { return chat_from_responses(j, nullptr); }),
            100);
}

}  // namespace fern::server
