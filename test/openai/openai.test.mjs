// Drives `kvlm serve` with the official openai client library for Node:
// completions, chat, streaming, n=2, stop sequences, the kv extension, the
// prefix cache, one document compressed once for many questions (kv.prefix),
// a conversation past the context (kv.policy streaming),
// a cancelled stream and malformed requests; the server runs with an API key
// (through $KVLM_API_KEY), and a wrong or missing key is refused.
//
//   cd test/openai && npm ci && node --test
//
// The server binary is $KVLM_BIN, or built here with `go build`; the model
// is stories260K from $KVLM_SHARED (default: ../shared beside the repository).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import OpenAI from 'openai';
import { shared, kvlmBin, serve, stop } from './serve.mjs';

const modelPath = path.join(shared, 'models', 'stories260K', 'stories260K.bin');
const tokPath = path.join(shared, 'models', 'stories260K', 'tok512.bin');
const MODEL = 'stories260K';
const API_KEY = `sk-kvlm-${randomBytes(16).toString('hex')}`;
const auth = { authorization: `Bearer ${API_KEY}` };

let server, baseURL, client, work;

before(async () => {
  assert.ok(existsSync(modelPath), `stories260K not found at ${modelPath} (set KVLM_SHARED)`);
  work = mkdtempSync(path.join(tmpdir(), 'kvlm-openai-'));
  ({ server, baseURL } = await serve(kvlmBin(work), ['-m', modelPath, '--tokenizer', tokPath,
    '--served-model-name', MODEL, '--slot-dir', work], { KVLM_API_KEY: API_KEY }));
  client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (server) assert.equal(await stop(server), 0, 'kvlm serve exits cleanly on SIGTERM');
  if (work) rmSync(work, { recursive: true, force: true });
});

async function metrics() {
  const text = await (await fetch(`${baseURL}/metrics`, { headers: auth })).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

test('models', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [MODEL]);
});

let greedy;

test('completion', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 30, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.ok(r.choices[0].text.length > 20, r.choices[0].text);
  assert.equal(r.usage.completion_tokens, 30);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 30);
  greedy = r.choices[0].text;
});

test('streamed completion equals the whole one', async () => {
  const stream = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stream: true });
  let text = '';
  let finish;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, greedy);
  assert.equal(finish, 'length');
});

test('chat, whole and streamed with usage', async () => {
  const messages = [{ role: 'system', content: 'A story.' }, { role: 'user', content: 'Once upon a time' }];
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 24, seed: 11 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 24, seed: 11, stream: true,
    stream_options: { include_usage: true } });
  let text = '';
  let usage;
  let role;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
});

test('n = 2', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 40, n: 2, temperature: 1, seed: 5 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.notEqual(r.choices[0].text, r.choices[1].text);
  const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Tom had a dog.' }],
    max_tokens: 10, n: 2, stream: true });
  const finished = new Set();
  for await (const chunk of stream) for (const c of chunk.choices) if (c.finish_reason) finished.add(c.index);
  assert.deepEqual([...finished].sort(), [0, 1]);
});

test('stop sequences', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stop: ['.', 'park'] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const text = r.choices[0].text;
  assert.ok(!text.includes('.') && greedy.startsWith(text) && text.length < greedy.length, JSON.stringify(text));
  const stream = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stop: '.', stream: true });
  let streamed = '';
  for await (const chunk of stream) streamed += chunk.choices.map((c) => c.text).join('');
  assert.equal(streamed, text);
});

test('kv extension: a policy and codecs per request', async () => {
  const prompt = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball.';
  const r = await client.completions.create({
    model: MODEL, prompt, max_tokens: 40,
    // @ts-expect-error kvlm's extension
    kv: { policy: 'snapkv', ratio: 0.25, type_k: 'q8', type_v: 'q8' },
  });
  const kv = r.usage.kv;
  assert.equal(kv.type_k, 'q8');
  assert.equal(kv.type_v, 'q8');
  assert.match(kv.policy, /^snapkv/);
  assert.ok(kv.evicted_tokens > 0 && kv.bytes_peak > 0, JSON.stringify(kv));
  const m = await metrics();
  assert.ok(m['kvlm_kv_evicted_tokens_total{policy="snapkv"}'] > 0);
});

test('one document, many questions: kv.prefix compresses the document once', async () => {
  const doc = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. '
    + 'She wanted to play with it, but it was too high. Lily asked her mom for help. Her mom lifted her up and Lily got the ball. They played all day.';
  const kv = { policy: 'snapkv', ratio: 0.25, window: 8, prefix: doc };
  const before = await metrics();
  const usages = [];
  for (const q of ['\nWho was in the story?', '\nWhat did Lily want?', '\nWho helped her?']) {
    const r = await client.completions.create({
      model: MODEL, prompt: doc + q, max_tokens: 8, temperature: 0,
      // @ts-expect-error kvlm's extension (the Python client's extra_body={"kv": ...})
      kv,
    });
    usages.push(r.usage);
  }
  const after = await metrics();
  // (The first may find raw blocks of earlier tests' prompts in the prefix cache.)
  assert.equal(usages[0].kv.computed_tokens + usages[0].prompt_tokens_details.cached_tokens, usages[0].prompt_tokens);
  assert.equal(usages[0].kv.compressed_tokens, 0);
  const docTokens = usages[1].kv.compressed_tokens;
  assert.ok(docTokens > 40, JSON.stringify(usages[1]));
  for (const u of usages.slice(1)) {
    assert.equal(u.kv.compressed_tokens, docTokens);
    assert.equal(u.kv.computed_tokens, u.prompt_tokens - docTokens);
    assert.equal(u.prompt_tokens_details.cached_tokens, docTokens);
  }
  assert.equal(after.kvlm_compressed_prefix_hits_total - before.kvlm_compressed_prefix_hits_total, 2);
  assert.ok(after.kvlm_compressed_prefix_bytes > 0);
  await assert.rejects(
    client.completions.create({ model: MODEL, prompt: 'Something else', max_tokens: 2,
      // @ts-expect-error kvlm's extension
      kv }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'kv.prefix');
});

test('a conversation past the context with kv.policy streaming', async () => {
  const story = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. ';
  const content = story.repeat(110); // about 3,000 tokens; the context is 512
  const r = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content }], max_tokens: 8, temperature: 0,
    // @ts-expect-error kvlm's extension
    kv: { policy: 'streaming', window: 60 },
  });
  assert.ok(r.usage.prompt_tokens > 2500, `${r.usage.prompt_tokens} prompt tokens`);
  assert.equal(r.usage.kv.computed_tokens, r.usage.prompt_tokens);
  assert.ok(r.usage.kv.evicted_tokens > 2000, JSON.stringify(r.usage.kv));
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: 8 }),
    (e) => e instanceof OpenAI.BadRequestError);
});

test('the same prompt twice is served from the prefix cache', async () => {
  const prompt = 'Lily and Ben went to the park. They saw a big tree with red apples. Ben wanted to climb the tree but Lily was scared.';
  const a = await client.completions.create({ model: MODEL, prompt, max_tokens: 5 });
  const before = await metrics();
  const b = await client.completions.create({ model: MODEL, prompt, max_tokens: 5 });
  const after = await metrics();
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= b.usage.prompt_tokens - 16 && cached > 0, `${cached} of ${b.usage.prompt_tokens}`);
  assert.equal(after.kvlm_prefix_cache_hits_total - before.kvlm_prefix_cache_hits_total, cached);
  // vLLM's labels: engine and model_name (in the exposition's order).
  const vllmHits = 'vllm:prefix_cache_hits_total{engine="0",model_name="stories260K"}';
  assert.ok(vllmHits in after, `no ${vllmHits} in /metrics`);
  assert.equal(after[vllmHits] - before[vllmHits], cached);
});

test('a cancelled stream frees its KV blocks', async () => {
  const stream = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 400, stream: true,
    // @ts-expect-error kvlm's extension
    kv: { cache_prompt: false } });
  let n = 0;
  for await (const chunk of stream) {
    if (++n === 5) {
      const m = await metrics();
      assert.ok(m['kvlm_kv_bytes_used'] > 0);
      stream.controller.abort();
      break;
    }
  }
  for (let i = 0; ; i++) {
    const m = await metrics();
    if (m.kvlm_kv_bytes_used === 0 && m.kvlm_requests_running === 0) break;
    assert.ok(i < 200, 'KV blocks not freed after the client went away');
    await new Promise((r) => setTimeout(r, 25));
  }
});

test('malformed requests are answered 400', async () => {
  const cases = [
    [{ model: MODEL, prompt: 'x', max_tokens: -1 }, /max_tokens/],
    [{ model: MODEL, prompt: 'x', kv: { policy: 'nonsense' } }, /unknown method/],
    [{ model: MODEL, prompt: 'x', kv: { policy: 'snapkv', ratio: 3 } }, /ratio/],
    [{ model: MODEL, prompt: 'x', temperature: 'warm' }, /temperature/],
    [{ model: MODEL, prompt: 'x'.repeat(5000) }, /context length/],
  ];
  for (const [body, re] of cases) {
    await assert.rejects(client.completions.create(body), (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `${err}`);
      assert.equal(err.status, 400);
      assert.match(err.message, re);
      return true;
    });
  }
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [] }), (err) => err.status === 400);
  await assert.rejects(client.completions.create({ model: 'gpt-nope', prompt: 'x' }), (err) => err.status === 404);
  // Invalid JSON, through fetch: the SDK always sends valid JSON.
  const res = await fetch(`${baseURL}/v1/completions`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: '{"prompt": ' });
  assert.equal(res.status, 400);
  assert.match((await res.json()).error.message, /invalid JSON/);
});

test('slot save and restore', async () => {
  const prompt = 'Tom had a red ball. He liked to throw it high in the sky and catch it.';
  await client.completions.create({ model: MODEL, prompt, max_tokens: 10,
    // @ts-expect-error kvlm's extension
    kv: { slot: 1 } });
  const post = (q, body) => fetch(`${baseURL}/v1/slots/1?action=${q}`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  let res = await post('save', { filename: 'tom.slot' });
  assert.equal(res.status, 200);
  assert.ok((await res.json()).n_saved > 0);
  res = await post('save', { filename: '../escape' });
  assert.equal(res.status, 400);
  res = await post('restore', { filename: 'tom.slot' });
  assert.equal(res.status, 200);
  assert.ok((await res.json()).n_restored > 0);
  // A form post, as a web page can send without a preflight, is refused.
  res = await fetch(`${baseURL}/v1/slots/1?action=erase`, { method: 'POST', headers: auth, body: new URLSearchParams({ a: '1' }) });
  assert.equal(res.status, 415);
  res = await post('erase', {});
  assert.equal(res.status, 200);
});

test('a wrong or missing API key is refused with 401; /health stays open', async () => {
  for (const apiKey of ['sk-wrong', API_KEY.slice(0, -1), `${API_KEY}x`]) {
    const bad = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
    await assert.rejects(bad.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 }), (err) => {
      assert.ok(err instanceof OpenAI.AuthenticationError, `${err}`);
      assert.equal(err.status, 401);
      assert.equal(err.code, 'invalid_api_key');
      return true;
    });
    await assert.rejects(bad.models.list(), (err) => err.status === 401);
  }
  for (const ep of ['/v1/models', '/metrics', '/v1/slots']) {
    const res = await fetch(`${baseURL}${ep}`);
    assert.equal(res.status, 401, ep);
    assert.equal((await res.json()).error.code, 'invalid_api_key');
  }
  assert.equal((await fetch(`${baseURL}/health`)).status, 200);
});
