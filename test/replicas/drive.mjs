// Drives three kvlm replicas behind haproxy with the official openai client
// (started by run.sh, which passes everything through $KVLM_REPLICAS_*):
//
//  1. baseline: greedy outputs of every prompt below, from a replica of its
//     own (no shared tier, nothing else sent to it);
//  2. shared system prompts through haproxy, one request at a time: the
//     first request of a prompt computes it, a replica that has not seen it
//     loads it from Redis (usage.kv.store_tokens > 0), a replica that has
//     seen it hits its own prefix cache; TTFT (streaming: time to the first
//     chunk) of each kind, medians;
//  3. Redis killed (SIGKILL) and restarted under load: no request fails,
//     kvlm_kv_store_errors_total rises, Redis hits come back after the
//     restart;
//  4. a replica killed (SIGKILL) under load: only requests in flight on it
//     (or not yet routed) may fail, each with a connection error or a 5xx,
//     never with text; haproxy takes it out;
//  5. every output through haproxy equals the baseline's.
//
// Prints a JSON summary; exits 1 when a check fails. Steps 2 and 3 need
// the shared tier (--kv-store); without it they are skipped, and under CI
// (CI set) that is a failure.

import OpenAI, { APIError, APIConnectionError } from 'openai';
import { readFileSync, writeFileSync, openSync } from 'node:fs';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';

const env = process.env;
const MODEL = 'stories260K';
const MAX_TOKENS = 8;
const work = env.KVLM_REPLICAS_WORK;
const replicaURLs = env.KVLM_REPLICAS_URLS.split(',');
const replicaPIDs = env.KVLM_REPLICAS_PIDS.split(',').map(Number);
const names = replicaURLs.map((_, i) => `r${i}`);
const store = env.KVLM_REPLICAS_STORE === '1';
const deadline = setTimeout(() => {
  console.error('replicas: the driver ran past 240 s');
  process.exit(1);
}, 240000);

// No retries: every failure is counted. lbFresh opens a connection per
// request (step 4): with kept-alive connections a request sent on one that
// haproxy closed as the replica died fails in the client before it reaches
// haproxy (a keep-alive race, seen in about one run in three), and could not
// be told from the failures the kill causes on the replica.
const clientOf = (base, headers = {}) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30000, defaultHeaders: headers });
const solo = clientOf(env.KVLM_REPLICAS_SOLO);
const lb = clientOf(env.KVLM_REPLICAS_LB);
const lbFresh = clientOf(env.KVLM_REPLICAS_LB, { connection: 'close' });

const failures = [];
function check(ok, what) {
  if (!ok) failures.push(what);
  return ok;
}

// Prompts. A system prompt is consecutive paragraphs of TinyStories text
// (several hundred tokens), each starting at another paragraph so that no
// two share a first block; a question follows it.
const paragraphs = readFileSync(env.KVLM_REPLICAS_TEXT, 'utf8').split(/\n\s*\n/).map((p) => p.trim())
  .filter((p) => p.length >= 150 && p.length <= 700 && /^[\x20-\x7e]+$/.test(p));
function longText(start) {
  let s = '';
  for (let i = start; s.length < 640; i++) s += (s ? '\n' : '') + paragraphs[i];
  return s.slice(0, 640);
}
const QUESTIONS = ['\nQ: Who is in the story?\nA:', '\nQ: Where are they?\nA:', '\nQ: What happened first?\nA:',
  '\nQ: How did it end?\nA:', '\nQ: Who was happy?\nA:', '\nQ: What did they find?\nA:'];
const sys = (k) => longText(10 * k);
const SHARED = [0, 1, 2].map(sys); // step 2
const FAULT = [3, 4, 5, 6].map(sys); // step 3: before, outage, after (two)
const FRESH = [7, 8, 9, 10].map((k) => sys(k) + QUESTIONS[0]); // recomputed: new to every replica and Redis
const PLAIN = ['Once upon a time', 'The little dog', 'Tom and Sue went to the park', 'One day a bird',
  'Lily had a red ball', 'The sun was hot and'];
const ask = (s, q) => s + QUESTIONS[q];

// One greedy completion: streamed (TTFT is the time to the first chunk) or
// not; the replica is the header haproxy adds.
async function complete(client, prompt, stream = true) {
  const t0 = performance.now();
  const body = { model: MODEL, prompt, max_tokens: MAX_TOKENS, temperature: 0 };
  if (!stream) {
    const { data, response } = await client.completions.create(body).withResponse();
    return { text: data.choices[0].text, usage: data.usage, replica: response.headers.get('x-kvlm-replica'),
      ms: performance.now() - t0, finish: data.choices[0].finish_reason };
  }
  const { data, response } = await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }).withResponse();
  const out = { text: '', ttft: null, usage: null, replica: response.headers.get('x-kvlm-replica'), finish: null };
  for await (const chunk of data) {
    if (out.ttft === null) out.ttft = performance.now() - t0;
    for (const c of chunk.choices ?? []) {
      out.text += c.text ?? '';
      if (c.finish_reason) out.finish = c.finish_reason;
    }
    if (chunk.usage) out.usage = chunk.usage;
  }
  if (!out.finish) throw new Error('stream ended without a finish_reason');
  out.ms = performance.now() - t0;
  return out;
}

async function scrape(base) {
  const out = {};
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}
// The sum of a metric's series (every label set) over the live replicas.
async function total(name, live = replicaURLs) {
  let sum = 0;
  for (const m of await Promise.all(live.map(scrape))) {
    for (const [k, v] of Object.entries(m)) if (k === name || k.startsWith(name + '{')) sum += v;
  }
  return sum;
}
async function waitFor(cond, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

// haproxy's view of a server: its row of the stats socket's CSV (status,
// scur: sessions now, stot: sessions in all).
function haproxyStat(server) {
  return new Promise((resolve, reject) => {
    const c = net.createConnection(env.KVLM_REPLICAS_HAPROXY_SOCK);
    let buf = '';
    c.on('connect', () => c.write('show stat\n'));
    c.on('data', (d) => { buf += d; });
    c.on('error', reject);
    c.on('end', () => {
      const rows = buf.split('\n');
      const head = rows[0].replace(/^# /, '').split(',');
      for (const r of rows.slice(1)) {
        const f = r.split(',');
        if (f[0] === 'kvlm' && f[1] === server) return resolve(Object.fromEntries(head.map((h, j) => [h, f[j]])));
      }
      resolve(null);
    });
  });
}
function redisPing() {
  return new Promise((resolve) => {
    const c = net.createConnection(Number(env.KVLM_REPLICAS_REDIS_PORT), '127.0.0.1');
    c.on('connect', () => c.write('PING\r\n'));
    c.on('data', (d) => { c.destroy(); resolve(String(d).startsWith('+PONG')); });
    c.on('error', () => resolve(false));
  });
}
const median = (xs) => {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return +(s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2).toFixed(2);
};

// Runs prompts through haproxy, `conc` at a time, calling hook(done) after
// each; returns one entry per request, failures included.
async function load(prompts, conc, hook = async () => {}, inflight = new Map(), client = lb) {
  const results = [];
  let next = 0;
  let done = 0;
  async function worker() {
    while (next < prompts.length) {
      const i = next++;
      const entry = { i, prompt: prompts[i], stream: i % 2 === 0, t0: performance.now() };
      inflight.set(i, entry);
      try {
        Object.assign(entry, await complete(client, prompts[i], entry.stream));
      } catch (err) {
        entry.error = err instanceof APIError && err.status ? `HTTP ${err.status}` : (err instanceof APIConnectionError ? 'connection error' : String(err.message || err));
        entry.cause = String(err.cause?.message ?? err.cause ?? '') + ' ' + String(err.cause?.cause?.message ?? err.cause?.cause?.code ?? '');
        entry.clean = err instanceof APIConnectionError || (err instanceof APIError && (err.status ?? 0) >= 500) ||
          /terminated|socket|ECONNRESET|finish_reason|other side closed/i.test(String(err.message || err));
      }
      inflight.delete(i);
      entry.t1 = performance.now();
      results.push(entry);
      await hook(++done);
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  return results.sort((a, b) => a.i - b.i);
}

const summary = { store, events: env.KVLM_REPLICAS_EVENTS === '1', max_tokens: MAX_TOKENS };
const outputs = []; // [prompt, text] of every request through haproxy that succeeded

// 1. The baseline.
const baseline = new Map();
{
  const prompts = [...PLAIN, ...FRESH];
  for (const s of [...SHARED, ...FAULT]) for (let q = 0; q < QUESTIONS.length; q++) prompts.push(ask(s, q));
  const t0 = performance.now();
  let longest = 0;
  let shortest = Infinity;
  for (const p of prompts) {
    const r = await complete(solo, p);
    baseline.set(p, r.text);
    if (p.length > 100) {
      longest = Math.max(longest, r.usage.prompt_tokens);
      shortest = Math.min(shortest, r.usage.prompt_tokens);
    }
  }
  summary.baseline = { prompts: prompts.length, seconds: +((performance.now() - t0) / 1000).toFixed(2),
    system_prompt_tokens: { min: shortest, max: longest } };
  check(shortest >= 200, `a long prompt has only ${shortest} tokens`);
}

// 2. Shared system prompts: compute, Redis hit, local hit.
if (store) {
  const ttft = { local_hit: [], redis_hit: [], recompute: [] };
  const wrong = [];
  const hits0 = await total('kvlm_kv_store_hit_blocks_total');
  for (const s of SHARED) {
    const seen = new Set();
    for (let q = 0; q < QUESTIONS.length; q++) {
      const written = await total('kvlm_kv_store_written_blocks_total');
      const r = await complete(lb, ask(s, q));
      outputs.push([ask(s, q), r.text]);
      const kv = r.usage.kv ?? {};
      const got = kv.cached_tokens > 0 ? 'local_hit' : (kv.store_tokens > 0 ? 'redis_hit' : 'recompute');
      const want = seen.size === 0 ? 'recompute' : (seen.has(r.replica) ? 'local_hit' : 'redis_hit');
      if (got !== want) wrong.push({ q, replica: r.replica, want, got, cached: kv.cached_tokens, store: kv.store_tokens });
      ttft[got].push(r.ttft);
      if (seen.size === 0) {
        // The write-through is asynchronous: wait for it before the next
        // replica looks the prompt up.
        check(await waitFor(async () => (await total('kvlm_kv_store_written_blocks_total')) > written, 3000),
          'the first request of a system prompt wrote no block to Redis');
      }
      seen.add(r.replica);
    }
  }
  for (const p of FRESH) {
    const r = await complete(lb, p);
    outputs.push([p, r.text]);
    check(!(r.usage.kv?.cached_tokens > 0) && !(r.usage.kv?.store_tokens > 0), 'a fresh prompt was served from a cache');
    ttft.recompute.push(r.ttft);
  }
  summary.shared_prompt = {
    requests: SHARED.length * QUESTIONS.length + FRESH.length,
    ttft_ms: Object.fromEntries(Object.entries(ttft).map(([k, v]) => [k, { median: median(v), n: v.length }])),
    store_hit_blocks: (await total('kvlm_kv_store_hit_blocks_total')) - hits0,
    unexpected: wrong,
  };
  check(wrong.length === 0, `${wrong.length} requests were not served as expected (compute once, Redis on other replicas, then local)`);
  check(ttft.redis_hit.length === 2 * SHARED.length, `${ttft.redis_hit.length} Redis hits, want ${2 * SHARED.length}`);
} else {
  summary.shared_prompt = 'skipped: this kvlm has no --kv-store';
  if (env.CI) check(false, 'kvlm serve has no --kv-store (steps 2 and 3 need it)');
}

// 3. Redis killed and restarted under a background load.
if (store) {
  const redisPidFile = path.join(work, 'pids', 'redis');
  const counters = async () => ({
    errors: await total('kvlm_kv_store_errors_total'),
    hit: await total('kvlm_kv_store_hit_blocks_total'),
    miss: await total('kvlm_kv_store_miss_blocks_total'),
  });
  const phases = {};
  // One phase: each system prompt's questions one at a time through
  // haproxy; counts the requests that could have come from Redis (on a
  // replica that had not seen the prompt) and those that did.
  async function phase(name, prompts) {
    const before = await counters();
    let eligible = 0;
    let redis = 0;
    let failed = 0;
    for (const s of prompts) {
      const seen = new Set();
      for (let q = 0; q < QUESTIONS.length; q++) {
        try {
          const r = await complete(lb, ask(s, q));
          outputs.push([ask(s, q), r.text]);
          if (seen.size > 0 && !seen.has(r.replica)) {
            eligible++;
            if (r.usage.kv?.store_tokens > 0) redis++;
          }
          if (seen.size === 0) await waitFor(async () => (await total('kvlm_kv_store_written_blocks_total')) > 0, 200);
          seen.add(r.replica);
        } catch (err) {
          failed++;
          failures.push(`Redis fault, phase ${name}: a request failed: ${err.message}`);
        }
      }
    }
    const after = await counters();
    const blocks = after.hit - before.hit + after.miss - before.miss;
    phases[name] = { requests: prompts.length * QUESTIONS.length, failed, redis_hit_requests: `${redis}/${eligible}`,
      block_hit_rate: blocks ? +((after.hit - before.hit) / blocks).toFixed(3) : null, store_errors: after.errors - before.errors };
  }
  let stop = false;
  const background = (async () => {
    const all = [];
    while (!stop && all.length < 2000) all.push(...await load(PLAIN, 2));
    return all;
  })();
  await phase('before', [FAULT[0]]);
  const errors0 = await total('kvlm_kv_store_errors_total');
  process.kill(Number(readFileSync(redisPidFile, 'utf8')), 'SIGKILL');
  await waitFor(async () => !(await redisPing()), 2000);
  await phase('outage', [FAULT[1]]);
  const cmd = env.KVLM_REPLICAS_REDIS_CMD.split('\n');
  const log = openSync(path.join(work, 'logs', 'redis'), 'a');
  const redis = spawn(cmd[0], cmd.slice(1), { stdio: ['ignore', log, log] });
  writeFileSync(redisPidFile, String(redis.pid));
  check(await waitFor(redisPing, 5000), 'redis-server did not restart');
  await phase('after', [FAULT[2], FAULT[3]]);
  stop = true;
  const bg = await background;
  for (const r of bg) if (!r.error) outputs.push([r.prompt, r.text]);
  const bgFailed = bg.filter((r) => r.error);
  summary.redis_fault = { ...phases, background_requests: bg.length, background_failed: bgFailed.length,
    store_errors_total_delta: (await total('kvlm_kv_store_errors_total')) - errors0 };
  check(bgFailed.length === 0, `${bgFailed.length} background requests failed while Redis was down: ${bgFailed.map((r) => r.error).join(', ')}`);
  check(phases.outage.failed === 0 && phases.before.failed === 0 && phases.after.failed === 0, 'a request failed because of Redis');
  check(summary.redis_fault.store_errors_total_delta > 0, 'kvlm_kv_store_errors_total did not rise while Redis was down');
  check(phases.before.redis_hit_requests.split('/')[0] > 0, 'no Redis hit before the fault');
  check(phases.after.redis_hit_requests.split('/')[0] > 0, 'the Redis hits did not come back after the restart');
} else {
  summary.redis_fault = 'skipped: this kvlm has no --kv-store';
}

// 4. A replica killed under load.
{
  const prompts = [];
  for (let i = 0; i < 36; i++) prompts.push(i % 3 === 0 ? PLAIN[i % PLAIN.length] : ask(SHARED[i % SHARED.length], i % QUESTIONS.length));
  const victim = 1;
  const inflight = new Map();
  let atKill = null;
  let killedAt = 0;
  let stotKill = 0;
  let downMs = null;
  const results = await load(prompts, 6, async (done) => {
    if (done === 10) {
      stotKill = Number((await haproxyStat(names[victim])).stot);
      atKill = [...inflight.values()].map((e) => e.i);
      killedAt = performance.now();
      process.kill(replicaPIDs[victim], 'SIGKILL');
      waitFor(async () => (await haproxyStat(names[victim])).status.startsWith('DOWN'), 5000)
        .then((ok) => { if (ok) downMs = performance.now() - killedAt; });
    }
  }, inflight, lbFresh);
  const down = await waitFor(async () => (await haproxyStat(names[victim])).status.startsWith('DOWN'), 5000);
  await waitFor(async () => downMs !== null, 1000);
  // What haproxy sent to the victim after the kill, before its health
  // checks took it out (a connection the dying process's socket still
  // accepted fails with a 502; one refused is retried elsewhere).
  const routedAfter = Number((await haproxyStat(names[victim])).stot) - stotKill;
  const failed = results.filter((r) => r.error);
  for (const r of results) if (!r.error) outputs.push([r.prompt, r.text]);
  const suspects = new Set(atKill);
  const late = failed.filter((r) => r.t0 > killedAt);
  if (env.KVLM_REPLICAS_DEBUG) {
    for (const r of results) console.error(`request ${r.i}: ${r.replica} from ${(r.t0 - killedAt).toFixed(0)} to ${(r.t1 - killedAt).toFixed(0)} ms after the kill ${r.error ?? 'ok'} ${r.cause ?? ''}`);
  }
  summary.replica_fault = {
    requests: results.length, failed: failed.length, in_flight_at_kill: atKill.length,
    failed_in_flight: failed.length - late.length, failed_sent_after_kill: late.length, routed_to_victim_after_kill: routedAfter,
    failure_kinds: [...new Set(failed.map((r) => r.error))],
    served_by_victim_after_kill: results.filter((r) => !r.error && r.replica === names[victim] && r.t0 > killedAt).length,
    down_after_ms: downMs === null ? null : +downMs.toFixed(0),
  };
  check(down, `haproxy did not mark ${names[victim]} down`);
  check(summary.replica_fault.served_by_victim_after_kill === 0, 'the killed replica answered a request sent after it was killed');
  check(failed.every((r) => r.clean), `a request failed uncleanly: ${failed.filter((r) => !r.clean).map((r) => r.error).join(', ')}`);
  check(failed.every((r) => suspects.has(r.i) || r.t0 > killedAt), 'a request failed that had ended before the kill');
  check(late.length <= routedAfter, `${late.length} requests sent after the kill failed, haproxy sent ${routedAfter} to the killed replica`);
  check(failed.length <= atKill.length + routedAfter, 'more requests failed than were in flight on the killed replica');
}

// 5. Every output through haproxy is the baseline's.
{
  const mismatches = outputs.filter(([p, t]) => baseline.get(p) !== t);
  summary.outputs = { compared: outputs.length, mismatches: mismatches.length };
  check(outputs.length > 0 && mismatches.length === 0,
    `${mismatches.length} outputs differ from the baseline: ${mismatches.slice(0, 3).map(([p, t]) => JSON.stringify([p.slice(-40), t, baseline.get(p)])).join(' ')}`);
}

// The KV events the replicas published (docs/KVEVENTS.md; their format is
// tested with a subscriber in test/kvevents and cmd/kvlm).
if (summary.events) {
  const live = replicaURLs.filter((_, i) => i !== 1);
  summary.kv_events = { published: await total('kvlm_kv_events_total', live), dropped: await total('kvlm_kv_events_dropped_total', live) };
  check(summary.kv_events.published > 0, 'the replicas published no KV event');
}

summary.failures = failures;
const json = JSON.stringify(summary, null, 2);
console.log(json);
if (env.KVLM_REPLICAS_JSON) writeFileSync(env.KVLM_REPLICAS_JSON, json + '\n');
clearTimeout(deadline);
console.log(failures.length ? `replicas: ${failures.length} checks failed` : 'replicas: every check passed');
process.exit(failures.length ? 1 : 0);
