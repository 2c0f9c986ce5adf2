// Tool calls through the official openai client library for Node: a
// scripted model (internal/scripted, written by `go run
// ./test/openai/scripted`) served with Qwen 2.5's chat template, whose
// greedy reply to any conversation is a <tool_call> block: the client
// reads tool_calls whole and streamed, sends the tool's result back in
// the next request, and a template that renders no tools is refused.
//
//   cd test/openai && npm ci && node --test

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { repo, kvlmBin, serve, stop } from './serve.mjs';

const MODEL = 'scripted';
let server, client, work;

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'] },
  },
}];

before(async () => {
  work = mkdtempSync(path.join(tmpdir(), 'kvlm-tools-'));
  const model = path.join(work, 'scripted.gguf');
  const spec = {
    template_file: path.join(repo, 'chat', 'testdata', 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja'),
    after: '\n',
    script: ['Let me look.', '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'],
    specials: ['<|im_start|>', '<|im_end|>', '<|endoftext|>'],
    eos: '<|im_end|>',
  };
  execFileSync('go', ['run', './test/openai/scripted', '-o', model], { cwd: repo, input: JSON.stringify(spec), stdio: ['pipe', 'inherit', 'inherit'] });
  let baseURL;
  ({ server, baseURL } = await serve(kvlmBin(work), ['-m', model, '--served-model-name', MODEL]));
  client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (server) assert.equal(await stop(server), 0, 'kvlm serve exits cleanly on SIGTERM');
  if (work) rmSync(work, { recursive: true, force: true });
});

const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('a reply with a tool call is read into tool_calls', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: ask, tools, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, 'Let me look.');
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });
});

test('streamed, the client assembles the same call', async () => {
  const stream = await client.chat.completions.create({ model: MODEL, messages: ask, tools, temperature: 0, stream: true });
  let content = '';
  let finish;
  const calls = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta.content) content += c.delta.content;
      for (const tc of c.delta.tool_calls ?? []) {
        calls[tc.index] ??= { id: '', name: '', arguments: '' };
        if (tc.id) calls[tc.index].id = tc.id;
        if (tc.function?.name) calls[tc.index].name += tc.function.name;
        if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, 'Let me look.');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris', unit: 'celsius' });
  // The SDK's own accumulation of a stream (ChatCompletionStream).
  const runner = client.chat.completions.stream({ model: MODEL, messages: ask, tools, temperature: 0 });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(final.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris', unit: 'celsius' });
});

test('the tool result goes back in the next request', async () => {
  const first = await client.chat.completions.create({ model: MODEL, messages: ask, tools, temperature: 0 });
  const msg = first.choices[0].message;
  const messages = [...ask, msg, { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: JSON.stringify({ temperature: 22 }) }];
  const r = await client.chat.completions.create({ model: MODEL, messages, tools, temperature: 0 });
  assert.ok(r.usage.prompt_tokens > first.usage.prompt_tokens, `${r.usage.prompt_tokens} vs ${first.usage.prompt_tokens}`);
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  // tool_choice "none": the same reply, as text.
  const none = await client.chat.completions.create({ model: MODEL, messages: ask, tools, tool_choice: 'none', temperature: 0 });
  assert.equal(none.choices[0].finish_reason, 'stop');
  assert.match(none.choices[0].message.content, /<tool_call>/);
  assert.equal(none.choices[0].message.tool_calls, undefined);
});

test('what kvlm cannot do is refused, not ignored', async () => {
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: ask, tools, tool_choice: 'required' }),
    (err) => err.status === 400 && /constrained decoding/.test(err.message));
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: ask, tools: [{ type: 'function', function: { name: 'bad name' } }] }),
    (err) => err.status === 400 && err.param === 'tools[0].function.name');
});
