// The Anthropic Messages API (/v1/messages) through the official `@anthropic-ai/sdk` against the real server:
// plain and streamed messages (the stream's final message equals the plain one), tool use and thinking blocks via
// forced output, a tool_result round trip, count_tokens, errors in Anthropic's envelope, and x-api-key auth.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { startServer, ROOT, MODEL } from './helpers.mjs';

const sdkPath = join(ROOT, 'third_party/npm/node_modules/@anthropic-ai/sdk/index.mjs');
const skip = existsSync(sdkPath) ? false : 'the @anthropic-ai/sdk npm package is not installed (third_party/npm)';
const Anthropic = skip ? null : (await import(pathToFileURL(sdkPath).href)).default;

let server;
let keyed;  // started with --api-key
let anthropic;
before(async () => {
  if (skip) return;
  [server, keyed] = await Promise.all([startServer(['--test-forced-output']), startServer(['--api-key', 'k3y'])]);
  anthropic = new Anthropic({ baseURL: server.base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  await Promise.all([server?.stop(), keyed?.stop()]);
});

const ask = [{ role: 'user', content: 'Tell me about Paris' }];
const tools = [{
  name: 'get_weather',
  description: 'Get the weather',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
}];
const call = '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>';

test('a message and its stream: text blocks, stop_reason, usage; the streamed final message equals the plain one', { skip }, async () => {
  const params = { model: 'claude-any-name', max_tokens: 10, temperature: 0, system: 'Be brief.', messages: ask };
  const m = await anthropic.messages.create(params);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, MODEL);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 10);
  assert.ok(m.usage.input_tokens > 5);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.content[0].text.length > 0);

  const events = [];
  const stream = anthropic.messages.stream(params);
  stream.on('streamEvent', (e) => events.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, m.content[0].text);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 10);
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_delta'));
});

test('tool use: a tool_use block with its input object and stop_reason tool_use, plain and streamed', { skip }, async () => {
  const params = { model: MODEL, max_tokens: 64, messages: ask, tools, test_forced_output: call };
  for (const m of [await anthropic.messages.create(params), await anthropic.messages.stream(params).finalMessage()]) {
    assert.equal(m.stop_reason, 'tool_use');
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.equal(uses[0].name, 'get_weather');
    assert.deepEqual(uses[0].input, { city: 'Paris', days: 2 });
    assert.match(uses[0].id, /\S/);
  }
});

test('thinking enabled: a thinking block before the text', { skip }, async () => {
  const m = await anthropic.messages.create({
    model: MODEL, max_tokens: 64, messages: ask, thinking: { type: 'enabled', budget_tokens: 32 },
    test_forced_output: '<think>\nThe user asks about Paris.\n</think>\n\nParis is the capital of France.',
  });
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(m.content[0].thinking.trim(), 'The user asks about Paris.');
  assert.equal(m.content[1].text, 'Paris is the capital of France.');
  assert.equal(m.stop_reason, 'end_turn');
});

test('a tool_result turn, stop sequences and count_tokens', { skip }, async () => {
  const history = [
    ...ask,
    { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' },
      { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'Sunny, 21 C' },
      { type: 'text', text: 'Thanks' }] },
  ];
  const m = await anthropic.messages.create({ model: MODEL, max_tokens: 8, messages: history, tools });
  assert.equal(m.type, 'message');
  const n = await anthropic.messages.countTokens({ model: MODEL, messages: history, tools });
  assert.ok(n.input_tokens > m.usage.input_tokens - 1 && n.input_tokens > 20, `${n.input_tokens}`);
  const s = await anthropic.messages.create({
    model: MODEL, max_tokens: 32, messages: ask, stop_sequences: ['capital'],
    test_forced_output: 'Paris is the capital of France.',
  });
  assert.equal(s.stop_reason, 'stop_sequence');
  assert.equal(s.stop_sequence, 'capital');
  assert.equal(s.content[0].text, 'Paris is the ');
});

test('errors come in Anthropic\'s envelope as the SDK\'s typed errors; x-api-key authenticates', { skip }, async () => {
  await assert.rejects(anthropic.messages.create({ model: MODEL, max_tokens: 0, messages: ask }),
    (e) => e.status === 400 && e.constructor.name === 'BadRequestError' && e.error?.type === 'error' &&
      e.error?.error?.type === 'invalid_request_error');
  await assert.rejects(anthropic.messages.create({
    model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'x' } }] }],
  }), (e) => e.status === 400 && /image/.test(e.message));
  const good = new Anthropic({ baseURL: keyed.base, apiKey: 'k3y', maxRetries: 0 });
  const m = await good.messages.create({ model: MODEL, max_tokens: 3, messages: ask });
  assert.equal(m.usage.output_tokens, 3);
  const bad = new Anthropic({ baseURL: keyed.base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: MODEL, max_tokens: 3, messages: ask }),
    (e) => e.status === 401 && e.constructor.name === 'AuthenticationError');
});
