// Scheduling and connection lifecycle: a client abort mid-stream (and while queued) frees the engine, 8 concurrent
// clients are all served in arrival order, and SIGTERM during a stream ends it cleanly with [DONE] and exit 0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL, metric, sleep, OpenAI } from './helpers.mjs';

let server;
let openai;
before(async () => {
  server = await startServer();
  openai = client(server);
});
after(async () => {
  await server?.stop();
});

const longStream = (extra = {}) => ({
  model: MODEL, messages: [{ role: 'user', content: 'Write forever' }], max_tokens: 3000, ignore_eos: true,
  stream: true, ...extra,
});

async function waitFor(pred, ms = 3000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return true;
    await sleep(25);
  }
  return false;
}

test('a client that aborts mid-stream is cancelled and the engine serves the next request', async () => {
  const ctl = new AbortController();
  const stream = await openai.chat.completions.create(longStream(), { signal: ctl.signal });
  let n = 0;
  try {
    // The SDK's stream iterator ends quietly on an abort (or throws an abort error, depending on timing).
    for await (const _ of stream) {
      if (++n === 5) ctl.abort();
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  assert.ok(n < 100, `the stream stopped after the abort (${n} chunks)`);
  const t0 = Date.now();
  assert.ok(await waitFor(async () => (await metric(server, 'fern_requests_running')) === 0, 1500),
    'the generation stopped within a second of the abort');
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3 });
  assert.equal(r.choices.length, 1);
  assert.ok(Date.now() - t0 < 5000);
});

test('a non-streaming client that disconnects while running or queued is cancelled', async () => {
  const ctl = new AbortController();
  const body = { model: MODEL, messages: [{ role: 'user', content: 'Go' }], max_tokens: 3000, ignore_eos: true };
  const running = openai.chat.completions.create(body, { signal: ctl.signal }).catch((e) => e);
  await sleep(150);
  const queued = openai.chat.completions.create(body, { signal: ctl.signal }).catch((e) => e);
  await sleep(150);
  assert.equal(await metric(server, 'fern_requests_running'), 1);
  ctl.abort();
  await running;
  await queued;
  assert.ok(await waitFor(async () => (await metric(server, 'fern_requests_running')) === 0 &&
    (await metric(server, 'fern_queue_depth')) === 0, 2000), 'both cancelled within about a second');
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3 });
  assert.equal(r.choices.length, 1);
});

test('8 concurrent clients are all served, in arrival order', async () => {
  // A long stream holds the engine first, so the 8 clients queue behind it however fast the backend is (on a GPU a
  // 20-token request finishes in milliseconds and would never queue); it is aborted once all 8 have arrived.
  const blockCtl = new AbortController();
  const blocker = await openai.chat.completions.create(longStream(), { signal: blockCtl.signal });
  const blockerIt = blocker[Symbol.asyncIterator]();
  await blockerIt.next();  // running now
  const finished = [];
  const jobs = [];
  for (let i = 0; i < 8; ++i) {
    jobs.push(openai.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: `Client ${i}` }], max_tokens: 20, ignore_eos: true,
    }).then((r) => {
      finished.push(i);
      return r;
    }));
    await sleep(50);  // distinct arrival times, even on a loaded machine; 8 x 50 ms well inside the blocker's run
  }
  // While they are queued, /health still answers at once (streams do not starve the HTTP threads).
  const t0 = Date.now();
  assert.equal((await fetch(`${server.base}/health`)).status, 200);
  assert.ok(Date.now() - t0 < 500, `health took ${Date.now() - t0} ms`);
  assert.equal(await metric(server, 'fern_queue_depth'), 8);
  blockCtl.abort();
  await blockerIt.return?.().catch(() => {});
  const results = await Promise.all(jobs);
  for (const r of results) {
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 20);
  }
  assert.deepEqual(finished, [0, 1, 2, 3, 4, 5, 6, 7]);
});

test('overload: beyond the queue, requests get 429 at once; accepted streams complete; /health stays fast', async () => {
  const srv = await startServer(['--max-queue', '2']);
  try {
    const c = client(srv);
    const t0 = Date.now();
    const outcomes = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
      try {
        const stream = await c.chat.completions.create(longStream({ max_tokens: 20, messages: [{ role: 'user', content: `n${i}` }] }));
        let reason;
        for await (const ch of stream) reason = ch.choices[0]?.finish_reason ?? reason;
        return { ok: reason };
      } catch (e) {
        return { status: e.status, after: Date.now() - t0, retry: e.headers?.get('retry-after') };
      }
    }).concat([(async () => {
      await sleep(200);
      const h0 = Date.now();
      const st = (await fetch(`${srv.base}/health`)).status;
      return { health: st, ms: Date.now() - h0 };
    })()]));
    const health = outcomes.pop();
    assert.equal(health.health, 200);
    // About 5 ms when measured on an idle machine; the bound leaves room for a loaded 2-core CI runner.
    assert.ok(health.ms < 750, `health took ${health.ms} ms`);
    const served = outcomes.filter((o) => o.ok);
    const refused = outcomes.filter((o) => o.status === 429);
    assert.equal(served.length + refused.length, 8, JSON.stringify(outcomes));
    assert.ok(served.length >= 3, 'the running request and the two queued ones are served');
    assert.ok(served.every((o) => o.ok === 'length'));
    assert.ok(refused.length >= 1);
    assert.ok(refused.every((o) => o.after < 2000 && Number(o.retry) >= 1), JSON.stringify(refused));
  } finally {
    await srv.stop();
  }
});

test('SIGTERM during a stream: the stream ends with [DONE], new requests are refused, exit code 0', async () => {
  const srv = await startServer(['--drain-seconds', '0.5']);
  try {
    const res = await fetch(`${srv.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(longStream({ max_tokens: 100000 })),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let text = '';
    const first = await reader.read();
    text += dec.decode(first.value);
    srv.proc.kill('SIGTERM');
    await sleep(100);
    const refused = await fetch(`${srv.base}/health`).then((r) => r.status).catch(() => 'closed');
    assert.ok(refused === 503 || refused === 'closed', `health during drain: ${refused}`);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += dec.decode(value);
    }
    const frames = text.split('\n\n').filter((f) => f.startsWith('data: '));
    assert.equal(frames[frames.length - 1], 'data: [DONE]');
    const last = JSON.parse(frames[frames.length - 2].slice(6));
    assert.ok(['length', 'stop'].includes(last.choices[0].finish_reason));
    const { code } = await srv.exited;
    assert.equal(code, 0);
  } finally {
    await srv.stop();
  }
});

test('SIGTERM with a short stream: it finishes normally within the drain time', async () => {
  const srv = await startServer(['--drain-seconds', '20']);
  try {
    const c = client(srv);
    const stream = await c.chat.completions.create(longStream({ max_tokens: 40 }));
    let n = 0;
    let reason;
    for await (const ch of stream) {
      if (++n === 2) srv.proc.kill('SIGTERM');
      reason = ch.choices[0]?.finish_reason ?? reason;
    }
    assert.equal(reason, 'length');
    const { code } = await srv.exited;
    assert.equal(code, 0);
  } finally {
    await srv.stop();
  }
});
