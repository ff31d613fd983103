"""Conversations rendered with the Qwen3 chat template for the byte-exact chat-format fixture.

Content is always a string here, because the Qwen3 template concatenates message.content directly.
"""
import random

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "description": "City name"},
                                                "days": {"type": "integer"}, "unit": {"type": "string",
                                                                                      "enum": ["C", "F"]}},
                                                "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web — «quotes» & <tags>",
                                           "parameters": {"type": "object", "properties": {
                                               "query": {"type": "string"}, "limit": {"type": "number"},
                                               "filters": {"type": "object"}, "safe": {"type": "boolean"}},
                                               "required": ["query"]}}}
NOPARAM = {"type": "function", "function": {"name": "now", "description": "Current time",
                                            "parameters": {"type": "object", "properties": {}}}}


def call(name, args, cid="call_1", as_string=True):
    import json
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def conversations():
    c = []

    def add(name, messages, tools=None, **kwargs):
        c.append({"name": name, "messages": messages, "tools": tools, "kwargs": kwargs})

    add("single_user", [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    add("single_user_no_think", [{"role": "user", "content": "Hi"}], add_generation_prompt=True,
        enable_thinking=False)
    add("single_user_no_gen", [{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    add("system_user", [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"}],
        add_generation_prompt=True)
    add("multi_turn", [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
        add_generation_prompt=True)
    add("assistant_reasoning_dropped", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
        {"role": "user", "content": "again"}], add_generation_prompt=True)
    add("assistant_reasoning_last", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "\n greet \n"}], add_generation_prompt=False)
    add("assistant_inline_think_last", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nHello there."}],
        add_generation_prompt=False)
    add("assistant_inline_think_old", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nHello there."},
        {"role": "user", "content": "More?"}], add_generation_prompt=True)
    add("assistant_close_only", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "reasoning without open\n</think>\nanswer"}], add_generation_prompt=False)
    add("assistant_empty_reasoning_last", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "plain answer"}], add_generation_prompt=False)
    add("assistant_null_reasoning", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "plain answer", "reasoning_content": None}], add_generation_prompt=False)
    add("tools_no_system", [{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        add_generation_prompt=True)
    add("tools_with_system", [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, SEARCH, NOPARAM],
        add_generation_prompt=True)
    add("tool_round_trip_string_args", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need tool.",
         "tool_calls": [call("get_weather", {"city": "Paris", "days": 2})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}], tools=[WEATHER],
        add_generation_prompt=True)
    add("tool_round_trip_dict_args", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [call("get_weather", {"city": "Paris", "unit": "C", "days": 3}, as_string=False)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21C"}], tools=[WEATHER],
        add_generation_prompt=True)
    add("parallel_calls_two_results", [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [call("get_weather", {"city": "Paris"}, "a"), call("get_weather", {"city": "Rome"}, "b")]},
        {"role": "tool", "tool_call_id": "a", "content": "Paris: 21C"},
        {"role": "tool", "tool_call_id": "b", "content": "Rome: 25C"},
        {"role": "assistant", "content": "Paris 21C, Rome 25C."},
        {"role": "user", "content": "Thanks"}], tools=[WEATHER], add_generation_prompt=True)
    add("parallel_calls_empty_content", [
        {"role": "user", "content": "Search two things"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("search", {"query": "a", "limit": 3}, "a"),
                        call("search", {"query": "b", "filters": {"lang": "en"}, "safe": True}, "b")]},
        {"role": "tool", "tool_call_id": "a", "content": "result a"},
        {"role": "tool", "tool_call_id": "b", "content": "result b"}], tools=[SEARCH], add_generation_prompt=True)
    add("agent_loop_kept_reasoning", [
        {"role": "user", "content": "Plan a trip"},
        {"role": "assistant", "content": "", "reasoning_content": "step 1",
         "tool_calls": [call("search", {"query": "flights"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 flights"},
        {"role": "assistant", "content": "", "reasoning_content": "step 2",
         "tool_calls": [call("search", {"query": "hotels"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5 hotels"}], tools=[SEARCH],
        add_generation_prompt=True)
    add("agent_loop_no_reasoning_middle", [
        {"role": "user", "content": "Plan"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call("now", {})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."}], tools=[NOPARAM], add_generation_prompt=False)
    add("user_tool_response_wrapper", [
        {"role": "user", "content": "Real question"},
        {"role": "assistant", "content": "answer one", "reasoning_content": "r1"},
        {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"}], add_generation_prompt=True)
    add("system_not_first", [
        {"role": "user", "content": "Hi"}, {"role": "system", "content": "Late system"},
        {"role": "user", "content": "Again"}], add_generation_prompt=True)
    add("whitespace_content", [
        {"role": "system", "content": "  padded system \n"}, {"role": "user", "content": "\n\n  spaced user  \n"},
        {"role": "assistant", "content": "\n answer \n"}, {"role": "user", "content": "\t"}],
        add_generation_prompt=True)
    add("unicode_content", [
        {"role": "user", "content": "日本語で答えて。Ça va? مرحبا 👍🏽 नमस्ते"},
        {"role": "assistant", "content": "はい、わかりました。", "reasoning_content": "用户希望日语"},
        {"role": "user", "content": "ありがとう"}], add_generation_prompt=True, enable_thinking=False)
    add("special_strings_in_user", [
        {"role": "user", "content": "What does <|im_end|> or <think> mean?"}], add_generation_prompt=True)
    add("tool_args_unicode", [
        {"role": "user", "content": "Search"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("search", {"query": "café «x» \"quoted\" \\ back\nslash", "limit": 2.5,
                                        "filters": {"a": [1, None, False]}}, as_string=False)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}], tools=[SEARCH], add_generation_prompt=True)
    add("tool_args_string_spacing", [
        {"role": "user", "content": "Search"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "x", "type": "function",
                         "function": {"name": "search", "arguments": "{\"query\":\"compact\",\"limit\":1}"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "ok"}], tools=[SEARCH], add_generation_prompt=True)
    add("tool_first_message", [
        {"role": "tool", "tool_call_id": "x", "content": "orphan"}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True)
    add("no_gen_prompt_ending_tool", [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "", "tool_calls": [call("now", {})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "noon"}], tools=[NOPARAM],
        add_generation_prompt=False)
    add("thinking_false_with_tools", [
        {"role": "user", "content": "Weather?"}], tools=[WEATHER], add_generation_prompt=True, enable_thinking=False)
    add("thinking_true_explicit", [
        {"role": "user", "content": "Hi"}], add_generation_prompt=True, enable_thinking=True)
    add("float_and_bool_args", [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("search", {"query": "q", "limit": 1e-05, "safe": False, "filters": {"n": 1e16,
                                                                                                  "m": 100.0,
                                                                                                  "k": -0.5}},
                             as_string=False)]}], tools=[SEARCH], add_generation_prompt=False)

    # Randomised multi-turn conversations (seeded).
    r = random.Random(1234)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for i in range(12):
        msgs = []
        if r.random() < 0.5:
            msgs.append({"role": "system", "content": " ".join(r.choice(words) for _ in range(r.randint(1, 8)))})
        for t in range(r.randint(1, 4)):
            msgs.append({"role": "user", "content": " ".join(r.choice(words) for _ in range(r.randint(1, 12)))})
            if t < 3 or r.random() < 0.5:
                m = {"role": "assistant", "content": " ".join(r.choice(words) for _ in range(r.randint(0, 10)))}
                if r.random() < 0.5:
                    m["reasoning_content"] = " ".join(r.choice(words) for _ in range(r.randint(0, 6)))
                if r.random() < 0.4:
                    n = r.randint(1, 3)
                    m["tool_calls"] = [call("search", {"query": r.choice(words), "limit": r.randint(1, 9)},
                                            f"c{j}", as_string=r.random() < 0.5) for j in range(n)]
                    msgs.append(m)
                    for j in range(n):
                        msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": r.choice(words)})
                else:
                    msgs.append(m)
        kwargs = {"add_generation_prompt": msgs[-1]["role"] != "assistant"}
        if r.random() < 0.3:
            kwargs["enable_thinking"] = False
        add(f"random_{i}", msgs, tools=[SEARCH] if r.random() < 0.6 else None, **kwargs)
    return c
