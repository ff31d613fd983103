// The OpenAI Responses API (/v1/responses) through the official `openai` SDK against the real server: plain and
// streamed responses (the stream's final response equals the plain one), function calls and reasoning items via
// forced output, continuing a stored conversation with previous_response_id, structured output, and errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, MODEL } from './helpers.mjs';

let server;
let openai;
before(async () => {
  server = await startServer(['--test-forced-output']);
  openai = client(server);
});
after(async () => {
  await server?.stop();
});

const tools = [{
  type: 'function', name: 'get_weather', description: 'Get the weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
// The text of a response's message items (the SDK adds output_text to created responses, not to streamed ones).
const textOf = (r) => r.output.filter((o) => o.type === 'message').flatMap((o) => o.content)
  .filter((c) => c.type === 'output_text').map((c) => c.text).join('');
const call = '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>';

test('a response and its stream: output_text, status, usage; the streamed final response has the same text', async () => {
  const params = { model: MODEL, input: 'Tell me a story', instructions: 'Be brief.', max_output_tokens: 8,
    temperature: 0, reasoning: { effort: 'none' } };
  const r = await openai.responses.create(params);
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.ok(r.output_text.length > 0);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.ok(r.usage.output_tokens <= 8 && r.usage.input_tokens > 5);
  const types = [];
  const stream = openai.responses.stream(params);
  stream.on('event', (e) => types.push(e.type));
  const final = await stream.finalResponse();
  assert.equal(textOf(final), r.output_text);
  assert.equal(types[0], 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  assert.ok(types.includes('response.output_text.delta') && types.includes('response.output_item.done'));
});

test('function calls, then their output sent back with previous_response_id', async () => {
  const first = await openai.responses.create({ model: MODEL, input: 'Weather in Paris?', tools, test_forced_output: call });
  const fc = first.output.find((o) => o.type === 'function_call');
  assert.ok(fc, JSON.stringify(first.output));
  assert.equal(fc.name, 'get_weather');
  assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris' });
  const streamed = await openai.responses.stream({ model: MODEL, input: 'Weather in Paris?', tools, test_forced_output: call })
    .finalResponse();
  assert.deepEqual(JSON.parse(streamed.output.find((o) => o.type === 'function_call').arguments), { city: 'Paris' });
  const second = await openai.responses.create({
    model: MODEL, previous_response_id: first.id, tools, max_output_tokens: 4,
    input: [{ type: 'function_call_output', call_id: fc.call_id, output: 'Sunny, 21 C' }],
  });
  assert.ok(second.usage.input_tokens > first.usage.input_tokens, 'the stored conversation was continued');
  await assert.rejects(openai.responses.create({ model: MODEL, previous_response_id: 'resp_nope', input: 'x' }),
    (e) => e.status === 404 && e.constructor.name === 'NotFoundError');
});

test('a reasoning item before the message, plain and streamed', async () => {
  const params = { model: MODEL, input: 'Why?', max_output_tokens: 64,
    test_forced_output: '<think>\nBecause it is.\n</think>\n\nIt just is.' };
  for (const r of [await openai.responses.create(params), await openai.responses.stream(params).finalResponse()]) {
    assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(r.output[0].content[0].text.trim(), 'Because it is.');
    assert.equal(textOf(r), 'It just is.');
  }
});

test('structured output through text.format, and 400s for what is not supported', async () => {
  const r = await openai.responses.create({
    model: MODEL, input: 'A colour', max_output_tokens: 200, seed: 2,
    text: { format: { type: 'json_schema', name: 'c', strict: true, schema: { type: 'object',
      properties: { c: { enum: ['red', 'blue'] } }, required: ['c'], additionalProperties: false } } },
  });
  if (r.status === 'completed') assert.ok(['red', 'blue'].includes(JSON.parse(r.output_text).c), r.output_text);
  const bad = async (params, param) => assert.rejects(openai.responses.create({ model: MODEL, ...params }),
    (e) => e.status === 400 && e.constructor.name === 'BadRequestError' && (!param || e.param === param));
  await bad({}, 'input');
  await bad({ input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0].type');
  await bad({ input: [{ type: 'input_image', image_url: 'x' }] }, 'input[0].type');
});
