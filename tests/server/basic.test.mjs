// Plain and streamed completions through the official openai SDK against the real `fern serve` (demo model):
// content, finish_reason, usage (with include_usage), /v1/models, seeds, stop strings, logprobs, /tokenize and
// /detokenize, /health and /metrics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL, metric } from './helpers.mjs';

let server;
let openai;
before(async () => {
  server = await startServer();
  openai = client(server);
});
after(async () => {
  await server?.stop();
});

const user = (content) => [{ role: 'user', content }];

test('GET /v1/models lists the served model and /v1/models/{id} returns it', async () => {
  const list = await openai.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, [MODEL]);
  const m = await openai.models.retrieve(MODEL);
  assert.equal(m.id, MODEL);
  assert.equal(m.object, 'model');
  await assert.rejects(openai.models.retrieve('no-such-model'), OpenAI_NotFound());
});

function OpenAI_NotFound() {
  return (e) => e.status === 404 && e.constructor.name === 'NotFoundError';
}

test('chat completion: content, finish_reason length at max_tokens, usage', async () => {
  const r = await openai.chat.completions.create({
    model: MODEL,
    messages: user('Hello there'),
    max_tokens: 12,
    temperature: 0,
    ignore_eos: true,
    chat_template_kwargs: { enable_thinking: false },
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, MODEL);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0, 'some text was generated');
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('streamed chat: role first, deltas that add up to the non-streamed text, finish chunk, usage chunk', async () => {
  const params = {
    model: MODEL,
    messages: user('Tell me a story'),
    max_tokens: 16,
    temperature: 0,
    ignore_eos: true,
    chat_template_kwargs: { enable_thinking: false },
  };
  const whole = await openai.chat.completions.create(params);
  const stream = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.ok(chunks.length >= 3);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, 'every chunk has the same id');
  assert.equal(new Set(chunks.map((c) => c.created)).size, 1);
  const text = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? '')).join('');
  assert.equal(text, whole.choices[0].message.content);
  const finals = chunks.filter((c) => c.choices.length && c.choices[0].finish_reason);
  assert.equal(finals.length, 1);
  assert.equal(finals[0].choices[0].finish_reason, 'length');
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, 16);
  assert.equal(last.usage.prompt_tokens, whole.usage.prompt_tokens);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
});

test('streamed chat without include_usage sends no usage chunk', async () => {
  const stream = await openai.chat.completions.create({
    model: MODEL, messages: user('Hi'), max_tokens: 4, stream: true, ignore_eos: true,
  });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.ok(chunks.every((c) => c.choices.length === 1));
  assert.ok(chunks.every((c) => c.usage === undefined || c.usage === null));
});

test('the same seed gives the same sampled output; another seed another', async () => {
  const params = {
    model: MODEL, messages: user('Pick some words'), max_tokens: 24, temperature: 1.0, top_p: 0.95,
    ignore_eos: true, chat_template_kwargs: { enable_thinking: false },
  };
  const a = await openai.chat.completions.create({ ...params, seed: 1234 });
  const b = await openai.chat.completions.create({ ...params, seed: 1234 });
  const c = await openai.chat.completions.create({ ...params, seed: 99 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

test('stop strings end the output before the stop text, streamed or not', async () => {
  // Raw completions: the text is exactly what the model produced, so the expected cut is exact.
  const params = { model: MODEL, prompt: 'Count with me:', max_tokens: 24, temperature: 0, ignore_eos: true };
  const full = Array.from((await openai.completions.create(params)).choices[0].text);
  assert.ok(full.length >= 8, `need some text to cut: ${JSON.stringify(full.join(''))}`);
  // A stop string from the middle of the greedy output (code points, so no surrogate pair is cut), which most
  // likely spans a token boundary.
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 3).join('');
  const text = full.join('');
  const want = text.slice(0, text.indexOf(stop));
  const r = await openai.completions.create({ ...params, stop: [stop, 'never-appears-xyz'] });
  assert.equal(r.choices[0].text, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const stream = await openai.completions.create({ ...params, stop, stream: true });
  let streamed = '';
  let reason;
  for await (const ch of stream) {
    streamed += ch.choices[0]?.text ?? '';
    reason = ch.choices[0]?.finish_reason ?? reason;
  }
  assert.equal(streamed, want);
  assert.equal(reason, 'stop');
});

test('stop strings on chat: finish_reason stop and the content is a prefix of the unstopped reply', async () => {
  const params = {
    model: MODEL, messages: user('Count'), max_tokens: 24, temperature: 0, ignore_eos: true,
    chat_template_kwargs: { enable_thinking: false },
  };
  const full = (await openai.chat.completions.create(params)).choices[0].message.content;
  const cps = Array.from(full);
  assert.ok(cps.length >= 8);
  const stop = cps.slice(Math.floor(cps.length / 2), Math.floor(cps.length / 2) + 2).join('');
  const r = await openai.chat.completions.create({ ...params, stop });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(!r.choices[0].message.content.includes(stop));
  assert.ok(full.startsWith(r.choices[0].message.content.trimEnd()));
});

test('completions endpoint: plain and streamed agree', async () => {
  const params = { model: MODEL, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, ignore_eos: true };
  const r = await openai.completions.create(params);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 10);
  const stream = await openai.completions.create({ ...params, stream: true });
  let text = '';
  for await (const ch of stream) text += ch.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

test('logprobs: one entry per token with its bytes and alternatives; streamed entries equal the plain ones', async () => {
  const params = {
    model: MODEL,
    messages: user('Name three colours'),
    max_tokens: 8,
    temperature: 0,
    ignore_eos: true,
    logprobs: true,
    top_logprobs: 3,
    chat_template_kwargs: { enable_thinking: false },
  };
  const r = await openai.chat.completions.create(params);
  const c = r.choices[0];
  const entries = c.logprobs.content;
  assert.equal(entries.length, r.usage.completion_tokens);
  for (const e of entries) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0, `a log-probability: ${e.logprob}`);
    assert.ok(Array.isArray(e.bytes) && e.bytes.length > 0);
    assert.equal(e.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    assert.ok(e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0) <= 1 + 1e-5);
  }
  // The tokens' bytes spell the reply.
  assert.equal(Buffer.from(entries.flatMap((e) => e.bytes)).toString('utf8'), c.message.content);

  const stream = await openai.chat.completions.create({ ...params, stream: true });
  const streamed = [];
  for await (const ch of stream) streamed.push(...(ch.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed, entries);

  const plain = await openai.chat.completions.create({ ...params, logprobs: false });
  assert.equal(plain.choices[0].logprobs, null);
  assert.equal(plain.choices[0].message.content, c.message.content);
});

test('/tokenize counts what a request would prefill; /detokenize gives the text back', async () => {
  const post = async (path, body) => {
    const r = await fetch(`${server.base}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body) });
    return { status: r.status, body: await r.json() };
  };
  const t = await post('/tokenize', { prompt: 'Hello there, world' });
  assert.equal(t.status, 200);
  assert.equal(t.body.count, t.body.tokens.length);
  assert.equal(t.body.max_model_len, 4096);
  const d = await post('/v1/detokenize', { tokens: t.body.tokens });
  assert.equal(d.body.prompt, 'Hello there, world');
  const messages = user('Count my tokens');
  const m = await post('/v1/tokenize', { model: MODEL, messages });
  const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 1 });
  assert.equal(m.body.count, r.usage.prompt_tokens);
  assert.equal((await post('/detokenize', { tokens: [-1] })).status, 400);
  assert.equal((await post('/tokenize', {})).status, 400);
});

test('/health answers ok and /metrics counts tokens', async () => {
  const h = await fetch(`${server.base}/health`);
  assert.equal(h.status, 200);
  assert.deepEqual(await h.json(), { status: 'ok' });
  const gen = await metric(server, 'fern_generation_tokens_total');
  assert.ok(gen > 0, `generated tokens counted: ${gen}`);
  assert.ok((await metric(server, 'fern_prompt_tokens_total')) > 0);
  assert.equal(await metric(server, 'fern_queue_depth'), 0);
  assert.ok((await metric(server, 'fern_time_to_first_token_seconds_count')) > 0);
});
