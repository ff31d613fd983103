// Multi-turn sessions: a 10-turn conversation where every turn reuses the snapshots of the previous ones
// (cached_tokens covers at least the whole previous prompt), and the greedy replies are identical to those of a
// server with the session cache disabled.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL, metric } from './helpers.mjs';

let cached;
let uncached;
before(async () => {
  [cached, uncached] = await Promise.all([startServer(), startServer(['--cache-bytes', '0'])]);
});
after(async () => {
  await Promise.all([cached?.stop(), uncached?.stop()]);
});

async function converse(srv, key) {
  const openai = client(srv);
  const messages = [{ role: 'system', content: 'You are a test assistant.' }];
  const turns = [];
  for (let i = 0; i < 10; ++i) {
    messages.push({ role: 'user', content: `Turn ${i}: say something about the number ${i * 7}.` });
    const r = await openai.chat.completions.create({
      model: MODEL, messages, max_tokens: 6, temperature: 0, prompt_cache_key: key,
    });
    const content = r.choices[0].message.content;
    turns.push({ content, usage: r.usage });
    messages.push({ role: 'assistant', content });
  }
  return turns;
}

test('10 turns: cached_tokens covers the previous turns, output identical with the cache disabled', async (t) => {
  const before = await metric(cached, 'fern_cache_hit_tokens_total');
  const a = await converse(cached, 'session-1');
  const b = await converse(uncached, 'session-1');
  for (let i = 0; i < 10; ++i) {
    assert.equal(a[i].content, b[i].content, `turn ${i}: same greedy reply with and without the cache`);
    assert.equal(a[i].usage.prompt_tokens, b[i].usage.prompt_tokens);
    assert.equal(b[i].usage.prompt_tokens_details.cached_tokens, 0, 'no reuse without the cache');
    if (i > 0) {
      const prev = a[i - 1].usage.prompt_tokens;
      const got = a[i].usage.prompt_tokens_details.cached_tokens;
      assert.ok(got >= prev, `turn ${i}: ${got} cached tokens cover the previous prompt (${prev} tokens)`);
      assert.ok(got < a[i].usage.prompt_tokens);
      t.diagnostic(`turn ${i}: prompt ${a[i].usage.prompt_tokens}, cached ${got}, previous prompt ${prev}`);
    }
  }
  const hits = (await metric(cached, 'fern_cache_hit_tokens_total')) - before;
  const want = a.reduce((s, t) => s + t.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(hits, want, 'the metrics count the reused tokens');
});

test('another session key does not reuse this session\'s snapshots', async () => {
  const openai = client(cached);
  const messages = [{ role: 'user', content: 'A private question about 42.' }];
  const first = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 3, temperature: 0, prompt_cache_key: 'alice' });
  messages.push({ role: 'assistant', content: first.choices[0].message.content }, { role: 'user', content: 'And 43?' });
  const bob = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 3, temperature: 0, prompt_cache_key: 'bob' });
  const alice = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 3, temperature: 0, prompt_cache_key: 'alice' });
  assert.equal(bob.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(alice.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens);
  assert.equal(alice.choices[0].message.content, bob.choices[0].message.content);
});
