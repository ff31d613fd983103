// Structured output (response_format json_object / json_schema) through the real server and the official SDK. The
// demo model's random weights never write JSON by themselves, so every reply that parses here does so because the
// server only lets the model pick tokens that keep it a prefix of a conforming value.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL } from './helpers.mjs';

let server;
let openai;
before(async () => {
  server = await startServer();
  openai = client(server);
});
after(async () => {
  await server?.stop();
});

const ask = [{ role: 'user', content: 'Describe a colour in JSON' }];
const schema = {
  type: 'object',
  properties: {
    colour: { type: 'string', enum: ['red', 'green', 'blue'] },
    count: { type: 'integer' },
    bright: { type: 'boolean' },
    note: { type: ['string', 'null'], maxLength: 8 },
  },
  required: ['colour', 'count', 'bright', 'note'],
  additionalProperties: false,
};
const format = { type: 'json_schema', json_schema: { name: 'colour', strict: true, schema } };

function checkColour(v) {
  assert.deepEqual(Object.keys(v).sort(), ['bright', 'colour', 'count', 'note']);
  assert.ok(['red', 'green', 'blue'].includes(v.colour), v.colour);
  assert.ok(Number.isInteger(v.count), String(v.count));
  assert.equal(typeof v.bright, 'boolean');
  assert.ok(v.note === null || (typeof v.note === 'string' && [...v.note].length <= 8), String(v.note));
}

test('json_schema: replies that end are JSON of the schema, plain and streamed alike', async () => {
  let ended = 0;
  for (const seed of [1, 2, 3]) {
    const params = { model: MODEL, messages: ask, max_tokens: 300, seed, response_format: format };
    const r = await openai.chat.completions.create(params);
    const c = r.choices[0];
    if (c.finish_reason === 'stop') {
      ended++;
      checkColour(JSON.parse(c.message.content));
    }
    const stream = await openai.chat.completions.create({ ...params, stream: true });
    let text = '';
    for await (const ch of stream) text += ch.choices[0]?.delta?.content ?? '';
    assert.equal(text, c.message.content);
  }
  assert.ok(ended >= 2, `replies end once the value is whole (${ended} of 3)`);
});

test('json_object: replies that end are JSON objects', async () => {
  let ended = 0;
  for (const seed of [1, 2, 3, 4]) {
    const r = await openai.chat.completions.create({
      model: MODEL, messages: ask, max_tokens: 300, seed, response_format: { type: 'json_object' },
    });
    const c = r.choices[0];
    // Free keys and values: random weights may write one long string until max_tokens.
    if (c.finish_reason !== 'stop') continue;
    ended++;
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  }
  assert.ok(ended >= 1, `some replies end (${ended} of 4)`);
});

test('unsupported schemas and contradictions are 400 with the parameter named', async () => {
  const bad = async (response_format, param, extra = {}) => {
    await assert.rejects(
      openai.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 5, response_format, ...extra }),
      (e) => e.status === 400 && e.constructor.name === 'BadRequestError' && e.param === param);
  };
  await bad({ type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: {} } } },
    'response_format.json_schema.schema');
  await bad({ type: 'json_schema', json_schema: { name: 'x' } }, 'response_format.json_schema.schema');
  await bad({ type: 'xml' }, 'response_format.type');
  const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
  await bad({ type: 'json_object' }, 'response_format', { tools, tool_choice: 'required' });
});
