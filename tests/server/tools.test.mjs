// Tool calls and reasoning end to end through the real server and the SDK. Random weights never produce them, so
// the server runs with --test-forced-output and each request forces the model's output text; the server still
// tokenizes it, runs the model on every token and parses the output exactly as it would the model's own.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL } from './helpers.mjs';

let server;
let plain;  // without the flag
let openai;
before(async () => {
  [server, plain] = await Promise.all([startServer(['--test-forced-output']), startServer()]);
  openai = client(server);
});
after(async () => {
  await Promise.all([server?.stop(), plain?.stop()]);
});

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the weather',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
}];
const ask = [{ role: 'user', content: 'Weather in Paris?' }];
const call = (city, days) =>
  `<tool_call>\n<function=get_weather>\n<parameter=city>\n${city}\n</parameter>\n<parameter=days>\n${days}\n</parameter>\n</function>\n</tool_call>`;
const reasoning = 'The user wants the weather. I should call the tool.';
const forcedCall = `<think>\n${reasoning}\n</think>\n\n${call('Paris', 2)}`;

test('a tool call is parsed: tool_calls, finish_reason tool_calls, reasoning_content', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, test_forced_output: forcedCall });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.tool_calls.length, 1);
  const tc = c.message.tool_calls[0];
  assert.equal(tc.type, 'function');
  assert.match(tc.id, /\S/);
  assert.equal(tc.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris', days: 2 });
  assert.equal(c.message.reasoning_content, reasoning);
  assert.ok(c.message.content === null || c.message.content === '');
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
});

test('streamed tool call: deltas as OpenAI sends them, assembled by the SDK stream helper', async () => {
  const stream = openai.chat.completions.stream({ model: MODEL, messages: ask, tools, test_forced_output: forcedCall });
  const toolDeltas = [];
  let reasoningText = '';
  stream.on('chunk', (ch) => {
    const d = ch.choices[0]?.delta;
    if (d?.tool_calls) toolDeltas.push(...d.tool_calls);
    if (d?.reasoning_content) reasoningText += d.reasoning_content;
  });
  const final = await stream.finalChatCompletion();
  assert.ok(toolDeltas.length >= 1);
  assert.equal(toolDeltas[0].index, 0);
  assert.match(toolDeltas[0].id, /\S/);
  assert.equal(toolDeltas[0].type, 'function');
  assert.equal(toolDeltas[0].function.name, 'get_weather');
  const args = toolDeltas.filter((d) => d.index === 0).map((d) => d.function?.arguments ?? '').join('');
  assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 2 });
  assert.equal(reasoningText, reasoning);
  const m = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', days: 2 });
});

test('parallel tool calls, and parallel_tool_calls=false keeps the first', async () => {
  const forced = `${call('Paris', 1)}\n${call('Rome', 3)}`;
  const r = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, test_forced_output: forced });
  const calls = r.choices[0].message.tool_calls;
  assert.equal(calls.length, 2);
  assert.deepEqual(calls.map((c) => JSON.parse(c.function.arguments).city), ['Paris', 'Rome']);
  assert.notEqual(calls[0].id, calls[1].id);
  const s = await openai.chat.completions.stream({ model: MODEL, messages: ask, tools, test_forced_output: forced }).finalChatCompletion();
  assert.deepEqual(s.choices[0].message.tool_calls.map((c) => JSON.parse(c.function.arguments).days), [1, 3]);
  const one = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, parallel_tool_calls: false, test_forced_output: forced });
  assert.equal(one.choices[0].message.tool_calls.length, 1);
});

test('tool_choice none: no tool parsing, the text stays content', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, tool_choice: 'none', test_forced_output: call('Oslo', 1) });
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.match(r.choices[0].message.content, /get_weather/);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('reasoning then an answer, streamed: reasoning_content deltas before content deltas', async () => {
  const forced = '<think>\nTwo plus two is four.\n</think>\n\nThe answer is 4.';
  const stream = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: '2+2?' }], stream: true, test_forced_output: forced });
  const order = [];
  let r = '';
  let c = '';
  for await (const ch of stream) {
    const d = ch.choices[0]?.delta ?? {};
    if (d.reasoning_content) { r += d.reasoning_content; order.push('r'); }
    if (d.content) { c += d.content; order.push('c'); }
  }
  assert.equal(r, 'Two plus two is four.');
  assert.equal(c, 'The answer is 4.');
  assert.ok(order.lastIndexOf('r') < order.indexOf('c'));
  const whole = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: '2+2?' }], test_forced_output: forced });
  assert.equal(whole.choices[0].message.reasoning_content, 'Two plus two is four.');
  assert.equal(whole.choices[0].message.content, 'The answer is 4.');
});

test('a conversation with tool results is accepted; thinking switches change the prompt', async () => {
  const messages = [
    ...ask,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","days":2}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const r = await openai.chat.completions.create({ model: MODEL, messages, tools, test_forced_output: 'It is 21 degrees.' });
  assert.equal(r.choices[0].message.content, 'It is 21 degrees.');
  const on = await openai.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 1 });
  const off = await openai.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 1, chat_template_kwargs: { enable_thinking: false } });
  const none = await openai.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 1, reasoning_effort: 'none' });
  assert.ok(off.usage.prompt_tokens > on.usage.prompt_tokens, 'the empty think block is in the prompt');
  assert.equal(none.usage.prompt_tokens, off.usage.prompt_tokens);
});

test('tool_choice named or required: the reply is started as a call of that function', async () => {
  // The model's own continuation is random here; the forced start is what the server guarantees.
  const named = await client(plain).chat.completions.create({
    model: MODEL, messages: ask, tools, max_tokens: 20, ignore_eos: true,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const m = named.choices[0].message;
  const text = m.content ?? '';
  const called = (m.tool_calls ?? []).some((c) => c.function.name === 'get_weather');
  assert.ok(called || text.startsWith('<tool_call>\n<function=get_weather>'), JSON.stringify(m));
  assert.equal(named.usage.completion_tokens, 20);
  const required = await client(plain).chat.completions.create({
    model: MODEL, messages: ask, tools, max_tokens: 12, ignore_eos: true, tool_choice: 'required',
  });
  const rm = required.choices[0].message;
  assert.ok((rm.tool_calls ?? []).length > 0 || (rm.content ?? '').startsWith('<tool_call>\n<function='), JSON.stringify(rm));
});

test('output cut inside a multi-byte character: whole characters only, streamed or not', async () => {
  const forced = '日本🫠𓀀鿿 ok';  // the last three characters span 3, 3 and 2 byte-level tokens
  for (let max = 1; max <= 8; ++max) {
    const params = { model: MODEL, messages: ask, max_tokens: max, test_forced_output: forced, chat_template_kwargs: { enable_thinking: false } };
    const r = await openai.chat.completions.create(params);
    const text = r.choices[0].message.content;
    assert.ok(!text.includes('\ufffd'), `max_tokens ${max}: ${JSON.stringify(text)}`);
    assert.ok(forced.startsWith(text), `max_tokens ${max}: ${JSON.stringify(text)}`);
    let streamed = '';
    for await (const ch of await openai.chat.completions.create({ ...params, stream: true })) streamed += ch.choices[0]?.delta?.content ?? '';
    assert.equal(streamed, text);
  }
});

test('without --test-forced-output the field is ignored', async () => {
  const r = await client(plain).chat.completions.create({
    model: MODEL, messages: ask, max_tokens: 8, ignore_eos: true, test_forced_output: 'FORCED TEXT',
    chat_template_kwargs: { enable_thinking: false },
  });
  assert.notEqual(r.choices[0].message.content, 'FORCED TEXT');
  assert.equal(r.usage.completion_tokens, 8);
});
