// The shared tier's cost on one replica (cost.sh starts the servers): the
// same kind of request sent to the server without a store ("off") and the
// one with --kv-store ("on") in turn, one at a time, the order swapped every
// pair; every prompt new to both (a number first, so no block is shared).
// TTFT: the time to the first streamed chunk; decode: the tokens after the
// first over the time from the first chunk to the last; CPU: the server's
// process_cpu_seconds_total over the request (the work done, which other
// load on the machine does not change as it changes wall time). Medians of
// each, and the median of the pairs' ratios (on/off, the two requests of a
// pair sent back to back, so a change of the machine's load between pairs
// cancels).

import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const env = process.env;
const pairs = Number(env.KVLM_COST_PAIRS);
const MAX_TOKENS = 200;
const urls = { off: env.KVLM_COST_OFF, on: env.KVLM_COST_ON };
const clients = {};
for (const k of Object.keys(urls)) {
  clients[k] = new OpenAI({ baseURL: `${urls[k]}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
}
const text = readFileSync(env.KVLM_COST_TEXT, 'utf8').replace(/\s+/g, ' ');
let next = 0;
const prompt = () => {
  const i = next++;
  return `Story ${i}. ` + text.slice(i * 480, i * 480 + 480);
};

async function cpu(k) {
  const text = await (await fetch(`${urls[k]}/metrics`)).text();
  return Number((text.match(/^process_cpu_seconds_total (\S+)$/m) ?? [])[1]);
}

async function one(k, p) {
  const client = clients[k];
  const c0 = await cpu(k);
  const t0 = performance.now();
  const stream = await client.completions.create({ model: 'stories260K', prompt: p, max_tokens: MAX_TOKENS, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let first = null;
  let last = null;
  let chunks = 0;
  let usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (!c.choices?.length) continue;
    last = performance.now();
    if (first === null) first = last;
    chunks++;
  }
  const n = usage.completion_tokens;
  return { ttft: first - t0, tps: n > 1 ? (n - 1) / ((last - first) / 1000) : null, cpu: (await cpu(k)) - c0, usage };
}

const median = (xs) => {
  const s = xs.filter((x) => x !== null).sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const runs = { off: [], on: [] };
// Warm both (first requests pay for page faults and the pool's growth).
for (let i = 0; i < 3; i++) for (const k of ['off', 'on']) await one(k, prompt());
let shared = 0;
for (let i = 0; i < pairs; i++) {
  for (const k of i % 2 ? ['on', 'off'] : ['off', 'on']) {
    const r = await one(k, prompt());
    if (r.usage.kv?.cached_tokens > 0 || r.usage.kv?.store_tokens > 0) shared++;
    runs[k].push(r);
  }
}
const written = await (await fetch(`${env.KVLM_COST_ON}/metrics`)).text();
const blocks = Number((written.match(/^kvlm_kv_store_written_blocks_total (\S+)$/m) ?? [])[1]);
const out = { pairs, max_tokens: MAX_TOKENS, prompt_tokens: median(runs.on.map((r) => r.usage.prompt_tokens)),
  requests_with_a_shared_prefix: shared, store_written_blocks: blocks };
for (const k of ['off', 'on']) {
  out[k] = { ttft_ms: +median(runs[k].map((r) => r.ttft)).toFixed(2), decode_tok_s: +median(runs[k].map((r) => r.tps)).toFixed(1),
    cpu_ms_per_request: +(1000 * median(runs[k].map((r) => r.cpu))).toFixed(1) };
}
const paired = (f) => +median(runs.on.map((r, i) => f(r) / f(runs.off[i]))).toFixed(3);
out.ratio_on_off = { ttft: paired((r) => r.ttft), decode: paired((r) => r.tps), cpu: paired((r) => r.cpu) };
if (env.KVLM_COST_DEBUG) for (const k of ["off", "on"]) console.error(k, runs[k].map((r) => [Math.round(r.ttft), Math.round(r.tps), Math.round(1000 * r.cpu)].join("/")).join(" "));
console.log(JSON.stringify(out, null, 2));
if (shared > 0 || !(blocks > 0)) {
  console.error('cost: a request shared a prefix, or the store wrote nothing: the measurement is not of nothing shared');
  process.exit(1);
}
