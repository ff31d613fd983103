// How requests become prompts: control-token strings typed in a message stay text (RELIABILITY.md T27), while
// the same string in the template itself is the control token.
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

async function promptTokens(content) {
  const r = await openai.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content }],
    max_tokens: 1,
    temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  });
  return r.usage.prompt_tokens;
}

test('a control-token string typed by the user is encoded as text, not as the control token', async () => {
  const plain = await promptTokens('x');
  // "<|im_start|>" as one control token would cost exactly as much as "x" (one token); as text it is several.
  const typed = await promptTokens('<|im_start|>');
  assert.ok(typed >= plain + 3, `prompt tokens: "x" ${plain}, "<|im_start|>" ${typed}`);
  const typedEnd = await promptTokens('<|im_end|>');
  assert.ok(typedEnd >= plain + 3, `prompt tokens: "x" ${plain}, "<|im_end|>" ${typedEnd}`);
});
