// Bad requests (RELIABILITY.md section 3 D) and every error status, through raw HTTP and as the SDK's typed errors:
// the right status, an OpenAI error envelope with a clear message, and the server keeps serving after each.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL, OpenAI, sleep, metric } from './helpers.mjs';

let server;
let limited;  // --ctx 64 --max-body-bytes 4k
let queue1;   // --max-queue 1
let authed;   // --api-key
before(async () => {
  [server, limited, queue1, authed] = await Promise.all([
    startServer(),
    startServer(['--ctx', '64', '--max-body-bytes', '4k']),
    startServer(['--max-queue', '1']),
    startServer(['--api-key', 'sekrit']),
  ]);
});
after(async () => {
  await Promise.all([server?.stop(), limited?.stop(), queue1?.stop(), authed?.stop()]);
});

const good = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };

async function post(srv, body, { path = '/v1/chat/completions', headers = {} } = {}) {
  const res = await fetch(srv.base + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text, headers: res.headers };
}

function assertEnvelope(r, status, { param, code, type = 'invalid_request_error', name = '' } = {}) {
  assert.equal(r.status, status, `${name}: ${r.text.slice(0, 300)}`);
  assert.ok(r.json && r.json.error, `error envelope: ${r.text}`);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 5, 'a message that says what is wrong');
  assert.equal(e.type, type);
  assert.ok('param' in e && 'code' in e);
  if (param !== undefined) assert.equal(e.param, param, e.message);
  if (code !== undefined) assert.equal(e.code, code);
}

async function stillServing(srv) {
  assert.equal((await fetch(srv.base + '/health')).status, 200);
  const r = await post(srv, good);
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices.length, 1);
}

const msgs = [{ role: 'user', content: 'Hi' }];
// [name, body (object or raw string), expected param (undefined = not checked)]
const badChat = [
  ['truncated JSON', '{"model":"fern-demo","messages":['],
  ['trailing garbage', '{"messages":[{"role":"user","content":"Hi"}]} xyz'],
  ['bad escape', '{"messages":[{"role":"user","content":"\\q"}]}'],
  ['NaN literal', '{"messages":[{"role":"user","content":"Hi"}],"temperature":NaN}'],
  ['Infinity literal', '{"messages":[{"role":"user","content":"Hi"}],"temperature":Infinity}'],
  ['array body', '[]'],
  ['string body', '"x"'],
  ['number body', '42'],
  ['null body', 'null'],
  ['empty body', ''],
  ['lone surrogate escape', '{"messages":[{"role":"user","content":"\\ud800"}]}'],
  ['invalid UTF-8 bytes', Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')])],
  ['100000 nested arrays', '['.repeat(100000)],
  ['deep nesting in tools', { messages: msgs, tools: [{ type: 'function', function: { name: 'f', parameters: JSON.parse('{"a":'.repeat(200) + '1' + '}'.repeat(200)) } }] }],
  ['messages not an array', { messages: 'hello' }, 'messages'],
  ['messages missing', { model: MODEL }, 'messages'],
  ['messages empty', { messages: [] }, 'messages'],
  ['content 123', { messages: [{ role: 'user', content: 123 }] }, 'messages[0].content'],
  ['role 123', { messages: [{ role: 123, content: 'x' }] }, 'messages[0].role'],
  ['no role', { messages: [{ content: 'x' }] }, 'messages[0].role'],
  ['unknown role', { messages: [{ role: 'wizard', content: 'x' }] }, 'messages[0].role'],
  ['user content null', { messages: [{ role: 'user', content: null }] }, 'messages[0].content'],
  ['tool message without tool_call_id', { messages: [...msgs, { role: 'tool', content: 'r' }] }, 'messages[1].tool_call_id'],
  ['image part', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }, 'messages[0].content[0].type'],
  ['stream "true"', { messages: msgs, stream: 'true' }, 'stream'],
  ['max_tokens "10"', { messages: msgs, max_tokens: '10' }, 'max_tokens'],
  ['max_tokens 1.5', { messages: msgs, max_tokens: 1.5 }, 'max_tokens'],
  ['max_tokens 0', { messages: msgs, max_tokens: 0 }, 'max_tokens'],
  ['max_tokens -1', { messages: msgs, max_tokens: -1 }, 'max_tokens'],
  ['max_completion_tokens -5', { messages: msgs, max_completion_tokens: -5 }, 'max_completion_tokens'],
  ['temperature "hot"', { messages: msgs, temperature: 'hot' }, 'temperature'],
  ['temperature -1', { messages: msgs, temperature: -1 }, 'temperature'],
  ['temperature 3', { messages: msgs, temperature: 3 }, 'temperature'],
  ['top_p 0', { messages: msgs, top_p: 0 }, 'top_p'],
  ['top_p 1.5', { messages: msgs, top_p: 1.5 }, 'top_p'],
  ['top_k -5', { messages: msgs, top_k: -5 }, 'top_k'],
  ['n 0', { messages: msgs, n: 0 }, 'n'],
  ['n 2', { messages: msgs, n: 2 }, 'n'],
  ['n 1000000', { messages: msgs, n: 1000000 }, 'n'],
  ['top_logprobs 21', { messages: msgs, top_logprobs: 21 }, 'top_logprobs'],
  ['top_logprobs -1', { messages: msgs, top_logprobs: -1 }, 'top_logprobs'],
  ['presence_penalty 10', { messages: msgs, presence_penalty: 10 }, 'presence_penalty'],
  ['seed -1', { messages: msgs, seed: -1 }, 'seed'],
  ['seed 2^64', '{"messages":[{"role":"user","content":"Hi"}],"seed":18446744073709551616}', 'seed'],
  ['logit_bias id out of vocabulary', { messages: msgs, logit_bias: { 999999999: 5 } }, 'logit_bias'],
  ['logit_bias non-numeric', { messages: msgs, logit_bias: { 10: 'x' } }, 'logit_bias'],
  ['logit_bias value 1000', { messages: msgs, logit_bias: { 10: 1000 } }, 'logit_bias'],
  ['10000 stop strings', { messages: msgs, stop: Array.from({ length: 10000 }, (_, i) => `s${i}`) }, 'stop'],
  ['one 2 KB stop string', { messages: msgs, stop: 'x'.repeat(2048) }, 'stop'],
  ['stop of numbers', { messages: msgs, stop: [1, 2] }, 'stop'],
  ['tools not an array', { messages: msgs, tools: { type: 'function' } }, 'tools'],
  ['tool parameters not an object', { messages: msgs, tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, 'tools[0].function.parameters'],
  ['tool type hiccup', { messages: msgs, tools: [{ type: 'hiccup', function: { name: 'f' } }] }, 'tools[0].type'],
  ['tool_choice naming an unknown function', { messages: msgs, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }, 'tool_choice'],
  ['tool_choice required without tools', { messages: msgs, tool_choice: 'required' }, 'tool_choice'],
  ['assistant tool_call arguments not JSON', { messages: [...msgs, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{oops' } }] }] }, 'messages[1].tool_calls[0].function.arguments'],
  ['response_format json_schema with an unsupported keyword', { messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { not: {} } } } }, 'response_format.json_schema.schema'],
  ['reasoning_effort "extreme"', { messages: msgs, reasoning_effort: 'extreme' }, 'reasoning_effort'],
  ['chat_template_kwargs.enable_thinking "no"', { messages: msgs, chat_template_kwargs: { enable_thinking: 'no' } }, 'chat_template_kwargs.enable_thinking'],
];

test(`${badChat.length} malformed chat requests get 400 with a clear message, and the server keeps serving`, async () => {
  for (const [name, body, param] of badChat) {
    const r = await post(server, body);
    assertEnvelope(r, 400, { param, name });
    assert.ok(!r.text.includes('\ufffd\ufffd'), `${name}: raw bytes echoed`);
  }
  await stillServing(server);
});

test('non-JSON content type is refused with 400', async () => {
  const r = await post(server, JSON.stringify(good), { headers: { 'Content-Type': 'text/plain' } });
  assertEnvelope(r, 400);
  await stillServing(server);
});

test('bad completions requests get 400', async () => {
  for (const [body, param] of [
    [{ model: MODEL }, 'prompt'],
    [{ prompt: 42 }, 'prompt'],
    [{ prompt: '' }, 'prompt'],
    [{ prompt: ['a', 'b'] }, 'prompt'],
    [{ prompt: [1, -3] }, 'prompt'],
    [{ prompt: 'x', echo: true }, 'echo'],
    [{ prompt: 'x', best_of: 3 }, 'best_of'],
  ]) {
    const r = await post(server, body, { path: '/v1/completions' });
    assertEnvelope(r, 400, { param });
  }
  await stillServing(server);
});

test('unknown fields are accepted', async () => {
  const r = await post(server, { ...good, frobnicate: { deep: [1, 2] }, user: 'u', metadata: { a: 'b' }, store: false, service_tier: 'auto', prompt_cache_key: 'k' });
  assert.equal(r.status, 200, r.text);
});

test('SDK typed errors: 400 BadRequestError, 404 NotFoundError (unknown model), unknown route 404', async () => {
  const openai = client(server);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /role/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ ...good, model: 'gpt-17' }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  const r = await fetch(server.base + '/v1/nothing-here');
  assert.equal(r.status, 404);
  assert.equal((await r.json()).error.type, 'not_found_error');
  const g = await fetch(server.base + '/v1/chat/completions');
  assert.equal(g.status, 405);
  await stillServing(server);
});

test('context_length_exceeded: 400 with the numbers; a prompt that leaves room is served', async () => {
  const openai = client(limited);
  const long = 'word '.repeat(200);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: long }] }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.code, 'context_length_exceeded');
      assert.equal(e.param, 'messages');
      assert.match(e.message, /maximum context length is 64 tokens/);
      assert.equal(e.error.n_ctx, 64);
      assert.ok(e.error.n_prompt_tokens > 64);
      return true;
    });
  // Huge max_tokens is clamped to the context: the reply ends with "length" at the context limit.
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1e12, ignore_eos: true });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, 64);
  // prompt = n_ctx - 1 is served with one token; prompt = n_ctx is refused (token-id prompts give exact lengths).
  const ok = await openai.completions.create({ model: MODEL, prompt: Array(63).fill(100), max_tokens: 1 });
  assert.equal(ok.usage.completion_tokens, 1);
  await assert.rejects(openai.completions.create({ model: MODEL, prompt: Array(64).fill(100), max_tokens: 1 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

test('413 for a body over --max-body-bytes', async () => {
  const r = await post(limited, { ...good, messages: [{ role: 'user', content: 'x'.repeat(8000) }] });
  assert.equal(r.status, 413);
  assert.equal(r.json.error.code, 'request_too_large');
  const openai = client(limited);
  await assert.rejects(openai.chat.completions.create({ ...good, messages: [{ role: 'user', content: 'y'.repeat(8000) }] }),
    (e) => e instanceof OpenAI.APIError && e.status === 413);
  await stillServing(limited);
});

test('429 with Retry-After when the queue is full', async () => {
  const openai = client(queue1);
  const long = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3000, ignore_eos: true, stream: true };
  // A runs, B waits in the one queue slot, C is refused at once; then A and B are aborted.
  const ctl = new AbortController();
  const a = await openai.chat.completions.create(long, { signal: ctl.signal });
  const itA = a[Symbol.asyncIterator]();
  await itA.next();
  const b = openai.chat.completions.create(long, { signal: ctl.signal }).catch((e) => e);
  const t0 = Date.now();
  while ((await metric(queue1, 'fern_queue_depth')) !== 1 && Date.now() - t0 < 5000) await sleep(20);
  const t1 = Date.now();
  await assert.rejects(openai.chat.completions.create(long, { signal: ctl.signal }), (e) => {
    assert.ok(e instanceof OpenAI.RateLimitError, String(e));
    assert.ok(Number(e.headers.get('retry-after')) >= 1);
    assert.equal(e.code, 'queue_full');
    return true;
  });
  assert.ok(Date.now() - t1 < 1000, 'refused without waiting');
  ctl.abort();
  await b;
  while ((await metric(queue1, 'fern_requests_running')) !== 0 && Date.now() - t0 < 10000) await sleep(20);
  await stillServing(queue1);
});

test('401 for a missing or wrong key on every inference route spelling; /health stays open', async () => {
  const paths = ['/v1/chat/completions', '/chat/completions', '//v1/chat/completions', '/v1/./chat/completions',
    '/V1/CHAT/COMPLETIONS', '/%2Fv1/chat/completions', '/v1/completions', '/v1/models'];
  for (const path of paths) {
    for (const headers of [{}, { Authorization: 'Bearer wrong' }]) {
      const r = await post(authed, good, { path, headers });
      assertEnvelope(r, 401, { type: 'authentication_error' });
    }
  }
  assert.equal((await fetch(authed.base + '/health')).status, 200);
  await assert.rejects(client(authed).chat.completions.create(good), (e) => e instanceof OpenAI.AuthenticationError);
  const ok = await client(authed, { apiKey: 'sekrit' }).chat.completions.create(good);
  assert.equal(ok.choices.length, 1);
});
