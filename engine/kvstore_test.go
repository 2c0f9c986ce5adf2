package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/redistest"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvstore"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/tensor"
	"github.com/redis/go-redis/v9"
)

// The shared KV tier against a real redis-server (internal/redistest):
// each engine is a "replica" with its own model, pool and Redis client.

func openStore(t *testing.T, url string) *kvstore.Redis {
	t.Helper()
	st, err := kvstore.OpenRedis(kvstore.Options{URL: url, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// replica is an engine over its own copy of stories260K with store st
// (nil: none), its fingerprint known (so the tier is on from the first
// request). Its store timeout is 10s unless cfg sets one: on a loaded
// 2-core machine a loopback round trip can take longer than the default
// 50ms, and a write or lookup timing out would change what these tests
// count.
func replica(t *testing.T, st kvstore.Store, cfg Config) (*Engine, *model.Model) {
	t.Helper()
	m, _ := loadStories(t)
	cfg.Store = st
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = 10 * time.Second
	}
	e := newEngine(t, m, cfg)
	<-e.fpDone
	return e, m
}

// flushed waits until e's store writer has nothing queued.
func flushed(t *testing.T, e *Engine) StoreStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.StoreStats()
		if st.QueuedBytes == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store writer still holds %d bytes", st.QueuedBytes)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// storeDelta is b − a, counter by counter.
func storeDelta(a, b StoreStats) StoreStats {
	return StoreStats{HitBlocks: b.HitBlocks - a.HitBlocks, MissBlocks: b.MissBlocks - a.MissBlocks, GetErrors: b.GetErrors - a.GetErrors,
		SetErrors: b.SetErrors - a.SetErrors, Corrupt: b.Corrupt - a.Corrupt, Written: b.Written - a.Written, Dropped: b.Dropped - a.Dropped,
		LoadedBytes: b.LoadedBytes - a.LoadedBytes, WrittenBytes: b.WrittenBytes - a.WrittenBytes}
}

// run submits one greedy request and checks it ended by length.
func run(t *testing.T, e *Engine, r GenRequest) outcome {
	t.Helper()
	o := collect(t, must(e.Submit(r)))
	if o.finish[0] != FinishLength {
		t.Fatalf("finish %s: %v", o.finish[0], o.errs[0])
	}
	return o
}

// TestStoreTwoReplicas: replica A computes a long prompt and writes its
// full blocks; replica B, with nothing in its local cache, loads them from
// Redis and computes only the tail, in every codec pair (q8/q4 keys stored
// around the model's key means); outputs equal a replica without the
// store. A prompt that shares only its start loads the shared blocks and
// stops at the first miss; a request with a policy loads what the method
// allows.
func TestStoreTwoReplicas(t *testing.T) {
	srv := redistest.Start(t)
	const T, gen, B = 300, 12, 16
	cfg := Config{PrefillChunk: 64, KeyShiftPrompt: []int{1}}
	a, _ := replica(t, openStore(t, srv.URL()), cfg)
	b, _ := replica(t, openStore(t, srv.URL()), cfg)
	ref, mref := replica(t, nil, cfg)
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, T)
	full := (T - 1) / B * B // MatchPrefix leaves one token
	codecs := []string{"f32", "f16", "bf16", "q8", "q4"}
	if testing.Short() {
		codecs = []string{"f32", "q8"} // CI's race run
	}
	for _, kv := range codecs {
		t.Run(kv, func(t *testing.T) {
			r := GenRequest{Prompt: prompt, MaxTokens: gen, K: kv, V: kv}
			want := run(t, ref, r).tokens[0]
			a0 := a.StoreStats()
			oa := run(t, a, r)
			sa := storeDelta(a0, flushed(t, a))
			if u := oa.usage; u.StoreTokens != 0 || u.ComputedTokens != T {
				t.Fatalf("replica A: %d store tokens, %d computed; want 0, %d", u.StoreTokens, u.ComputedTokens, T)
			}
			blocks := (T + gen - 1) / B // the prompt and the generated tokens fed, registered when the request ends
			pool, err := a.pool(kv, kv)
			if err != nil {
				t.Fatal(err)
			}
			a.ref(pool, -1)
			entry := int64(kvstore.EntrySize(B, pool.TierBlockBytes()))
			if sa.Written != int64(blocks) || sa.WrittenBytes != int64(blocks)*entry || sa.Dropped != 0 || sa.MissBlocks != int64(full/B) {
				t.Fatalf("replica A: %+v (%+v); want %d blocks (%d bytes) written, %d missed", sa, a.StoreStats(), blocks, int64(blocks)*entry, full/B)
			}
			b0 := b.StoreStats()
			ob := run(t, b, r)
			sb := storeDelta(b0, b.StoreStats())
			if u := ob.usage; u.StoreTokens != full || u.CachedTokens != 0 || u.ComputedTokens != T-full {
				t.Fatalf("replica B: %d store tokens, %d cached, %d computed; want %d, 0, %d", u.StoreTokens, u.CachedTokens, u.ComputedTokens, full, T-full)
			}
			if sb.HitBlocks != int64(full/B) || sb.MissBlocks != 0 || sb.LoadedBytes != int64(full/B)*int64(pool.TierBlockBytes()) || sb.Corrupt != 0 || sb.GetErrors != 0 {
				t.Fatalf("replica B: %+v; want %d hits", sb, full/B)
			}
			if !slices.Equal(oa.tokens[0], want) || !slices.Equal(ob.tokens[0], want) {
				t.Fatalf("tokens A %v, B %v; want %v (no store)", oa.tokens[0], ob.tokens[0], want)
			}
			// B's local cache now has them: cached, not loaded again.
			oc := run(t, b, r)
			if u := oc.usage; u.StoreTokens != 0 || u.CachedTokens != full || !slices.Equal(oc.tokens[0], want) {
				t.Fatalf("replica B again: %d store tokens, %d cached; want 0, %d", u.StoreTokens, u.CachedTokens, full)
			}
		})
	}
	t.Run("shared start", func(t *testing.T) {
		c, _ := replica(t, openStore(t, srv.URL()), cfg)
		const shared = 150
		p := append(slices.Clone(prompt[:shared]), longPrompt(t, tok, 400)[250:350]...)
		r := GenRequest{Prompt: p, MaxTokens: gen}
		want := reference(t, mref, p, gen, r.Sampling)
		c0 := c.StoreStats()
		o := run(t, c, r)
		d := storeDelta(c0, c.StoreStats())
		if o.usage.StoreTokens != shared/B*B || d.HitBlocks != shared/B || d.MissBlocks != int64((len(p)-1)/B-shared/B) {
			t.Fatalf("%d store tokens, %+v; want %d tokens, %d hits, %d misses", o.usage.StoreTokens, d, shared/B*B, shared/B, (len(p)-1)/B-shared/B)
		}
		if !slices.Equal(o.tokens[0], want) {
			t.Fatalf("tokens %v, want %v", o.tokens[0], want)
		}
	})
	t.Run("policy", func(t *testing.T) {
		c, m := replica(t, openStore(t, srv.URL()), cfg)
		pc := policy.Config{Method: "snapkv", Ratio: 0.25}
		o := run(t, c, GenRequest{Prompt: prompt, MaxTokens: gen, Policy: pc})
		if want := (T - 32) / B * B; o.usage.StoreTokens != want || o.usage.ComputedTokens != T-want {
			t.Fatalf("%d store tokens, %d computed; want %d, %d (the observation window computed)", o.usage.StoreTokens, o.usage.ComputedTokens, want, T-want)
		}
		norm, err := pc.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := generatePeak(t, m, norm, prompt, gen, 64); !slices.Equal(o.tokens[0], want) {
			t.Fatalf("tokens %v, want %v (the whole prompt computed in one sequence)", o.tokens[0], want)
		}
	})
	checkFree(t, a)
	checkFree(t, b)
}

// storedKey is the Redis key of prompt's block j in e's default pool.
func storedKey(t *testing.T, e *Engine, prompt []int, j int) string {
	t.Helper()
	ns, ok := e.namespace(e.defPool)
	if !ok {
		t.Fatal("no namespace")
	}
	hashes, _ := e.defPool.PrefixChain(prompt, 0)
	return kvstore.Key(ns, hashes[j])
}

// TestStoreCorrupt: an entry damaged in Redis (one byte flipped in the
// header, the tokens, the payload or the checksum; truncated; another
// block's entry under its key) is refused and counted, the blocks from it
// on are computed, and the output is the same.
func TestStoreCorrupt(t *testing.T) {
	srv := redistest.Start(t)
	const T, gen, B, bad = 200, 10, 16, 5
	a, _ := replica(t, openStore(t, srv.URL()), Config{})
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, T)
	r := GenRequest{Prompt: prompt, MaxTokens: gen}
	want := run(t, a, r).tokens[0]
	flushed(t, a)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rc.Close()
	ctx := context.Background()
	key := storedKey(t, a, prompt, bad)
	orig, err := rc.Get(ctx, key).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	other, err := rc.Get(ctx, storedKey(t, a, prompt, bad+1)).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) []byte { b := slices.Clone(orig); b[i] ^= 0x10; return b }
	cases := []struct {
		name string
		val  []byte
	}{
		{"namespace byte", flip(10)},
		{"token byte", flip(45)},
		{"payload byte", flip(len(orig) / 2)},
		{"last payload byte", flip(len(orig) - 9)},
		{"checksum byte", flip(len(orig) - 1)},
		{"truncated", orig[:len(orig)-100]},
		{"another block's entry", other},
		{"garbage", []byte("not an entry")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := rc.Set(ctx, key, c.val, 0).Err(); err != nil {
				t.Fatal(err)
			}
			defer rc.Set(ctx, key, orig, 0)
			b, _ := replica(t, openStore(t, srv.URL()), Config{})
			o := run(t, b, r)
			st := b.StoreStats()
			if o.usage.StoreTokens != bad*B || st.Corrupt != 1 || st.HitBlocks != bad || st.MissBlocks != int64((T-1)/B-bad) {
				t.Fatalf("%d store tokens, %+v; want %d tokens, 1 corrupt, %d hits, %d misses", o.usage.StoreTokens, st, bad*B, bad, (T-1)/B-bad)
			}
			if o.usage.ComputedTokens != T-bad*B || !slices.Equal(o.tokens[0], want) {
				t.Fatalf("%d computed, tokens %v; want %d, %v", o.usage.ComputedTokens, o.tokens[0], T-bad*B, want)
			}
		})
	}
}

// TestStoreNamespace: blocks written by one replica are not read by a
// replica of another model (one weight changed: another fingerprint),
// another codec, another block size or without key means; the same
// configuration reads them.
func TestStoreNamespace(t *testing.T) {
	srv := redistest.Start(t)
	const T, gen = 200, 8
	a, _ := replica(t, openStore(t, srv.URL()), Config{})
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, T)
	run(t, a, GenRequest{Prompt: prompt, MaxTokens: gen})
	run(t, a, GenRequest{Prompt: prompt, MaxTokens: gen, K: "q8", V: "q8"}) // key means off in a
	flushed(t, a)
	cases := []struct {
		name   string
		cfg    Config
		change func(m *model.Model)
		kv     string
		reads  bool
	}{
		{"same model and configuration", Config{}, nil, "", true},
		{"one weight changed", Config{}, func(m *model.Model) {
			l := &m.Layers[len(m.Layers)-1]
			f := slices.Clone(l.WUp.F32())
			f[3] = -f[3]
			l.WUp = tensor.MatrixF32(l.WUp.Rows, l.WUp.Cols, f)
		}, "", false},
		{"another codec", Config{}, nil, "f16", false},
		{"another block size", Config{BlockTokens: 32}, nil, "", false},
		{"q8 with key means", Config{KeyShiftPrompt: []int{1}}, nil, "q8", false},
		{"q8 without key means", Config{}, nil, "q8", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, _ := loadStories(t)
			if c.change != nil {
				c.change(m)
			}
			cfg := c.cfg
			cfg.Store, cfg.StoreTimeout = openStore(t, srv.URL()), 10*time.Second
			b := newEngine(t, m, cfg)
			<-b.fpDone
			r := GenRequest{Prompt: prompt, MaxTokens: gen, K: c.kv, V: c.kv}
			o := run(t, b, r)
			st := b.StoreStats()
			if got := o.usage.StoreTokens > 0 || st.HitBlocks > 0; got != c.reads {
				t.Fatalf("%d store tokens, %+v; reads %v, want %v", o.usage.StoreTokens, st, got, c.reads)
			}
			if !c.reads && (st.MissBlocks == 0 || st.Corrupt != 0) {
				t.Fatalf("%+v: want misses (another namespace: other keys), nothing corrupt", st)
			}
			want := reference(t, m, prompt, gen, r.Sampling)
			if c.kv == "" && !slices.Equal(o.tokens[0], want) {
				t.Fatalf("tokens %v, want %v (this model, no store)", o.tokens[0], want)
			}
		})
	}
}

// TestStoreDown: with Redis killed every request succeeds with the output
// of no store, lookups and writes fail and are counted; Redis back, blocks
// are written and read again.
func TestStoreDown(t *testing.T) {
	srv := redistest.Start(t)
	const T, gen, B = 200, 8, 16
	_, tok := loadStories(t)
	text := longPrompt(t, tok, 2*T)
	p1, p2 := text[:T], append([]int{1}, text[T:2*T-1]...)
	a, m := replica(t, openStore(t, srv.URL()), Config{})
	want1 := reference(t, m, p1, gen, GenRequest{}.Sampling)
	want2 := reference(t, m, p2, gen, GenRequest{}.Sampling)
	run(t, a, GenRequest{Prompt: p1, MaxTokens: gen})
	flushed(t, a)
	srv.Kill()
	bst := openStore(t, srv.URL())
	b, _ := replica(t, bst, Config{})
	t0 := time.Now()
	h, err := b.Submit(GenRequest{Prompt: p1, MaxTokens: gen})
	if d := time.Since(t0); err != nil || d > 3*time.Second {
		t.Fatalf("Submit with Redis down: %v after %s (the lookup's one dial is refused at once)", err, d)
	}
	o := collect(t, h)
	if o.finish[0] != FinishLength {
		t.Fatalf("finish %s: %v", o.finish[0], o.errs[0])
	}
	st := flushed(t, b)
	if o.usage.StoreTokens != 0 || !slices.Equal(o.tokens[0], want1) || st.GetErrors != 1 || st.SetErrors < 1 || st.Written != 0 || st.MissBlocks != (T-1)/B {
		t.Fatalf("Redis down: %d store tokens, tokens %v (want %v), %+v; want get and set errors, %d misses", o.usage.StoreTokens, o.tokens[0], want1, st, (T-1)/B)
	}
	srv.Restart() // empty
	// go-redis's pool, after failed dials, dials again once a second:
	// wait until b's client reaches the server.
	for deadline := time.Now().Add(10 * time.Second); bst.Ping(context.Background()) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Redis back: b's client does not reach it in 10s")
		}
	}
	run(t, b, GenRequest{Prompt: p2, MaxTokens: gen})
	if st := flushed(t, b); st.Written == 0 {
		t.Fatalf("Redis back: nothing written: %+v", st)
	}
	c, _ := replica(t, openStore(t, srv.URL()), Config{})
	o = run(t, c, GenRequest{Prompt: p2, MaxTokens: gen})
	if o.usage.StoreTokens != (T-1)/B*B || !slices.Equal(o.tokens[0], want2) {
		t.Fatalf("Redis back: %d store tokens, tokens %v, %+v; want %d, %v", o.usage.StoreTokens, o.tokens[0], c.StoreStats(), (T-1)/B*B, want2)
	}
}

// slowStore is a Store whose Get takes until its context's deadline
// (unless fastGet: then it finds nothing at once) and whose Put waits
// until the gate opens.
type slowStore struct {
	gate      chan struct{}
	closeOnce sync.Once
	fastGet   bool
}

func (s *slowStore) Get(ctx context.Context, keys []string) ([][]byte, error) {
	if s.fastGet {
		return make([][]byte, len(keys)), nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *slowStore) Put(ctx context.Context, keys []string, vals [][]byte) error {
	select {
	case <-s.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowStore) Close() error { return nil }

// TestStoreSlow: a store that answers lookups at the timeout and never
// acknowledges writes does not slow the others: a request decodes to its
// end while another waits for its lookup, and a request's writes fill the
// bounded queue, the rest dropped and counted, with its decode unaffected.
func TestStoreSlow(t *testing.T) {
	const wait = 800 * time.Millisecond
	st := &slowStore{gate: make(chan struct{})}
	e, _ := replica(t, st, Config{StoreTimeout: wait, StoreQueue: 1})
	t.Cleanup(func() { st.closeOnce.Do(func() { close(st.gate) }) }) // before e.Close (cleanups run last first)
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, 300)
	// A request with no prefix cache does no lookup: it decodes while
	// another waits for its lookup in Submit.
	long := must(e.Submit(GenRequest{Prompt: prompt[:8], MaxTokens: 400, NoPrefixCache: true}))
	if ev, err := long.Next(context.Background()); err != nil || ev.Done {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	var times []time.Time // of the long request's tokens
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			ev, err := long.Next(context.Background())
			if err != nil {
				return
			}
			if !ev.Done {
				times = append(times, time.Now())
			}
		}
	}()
	t0 := time.Now()
	h, err := e.Submit(GenRequest{Prompt: prompt, MaxTokens: 10})
	t1 := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if lookup := t1.Sub(t0); lookup < wait {
		t.Fatalf("the lookup returned after %s, before the store's %s", lookup, wait)
	}
	<-read
	// The long request decoded meanwhile: tokens came during the lookup
	// (all of them, unless the machine is slow), none held back for it.
	during := 0
	for _, at := range times {
		if at.After(t0) && at.Before(t1) {
			during++
		}
	}
	if len(times) != 399 || during < min(50, len(times)) {
		t.Fatalf("long request: %d more tokens, %d of them during the %s lookup", len(times), during, t1.Sub(t0))
	}
	o2 := collect(t, h)
	if o2.finish[0] != FinishLength || o2.usage.StoreTokens != 0 {
		t.Fatalf("second request: %s, %d store tokens", o2.finish[0], o2.usage.StoreTokens)
	}
	ss := e.StoreStats()
	// StoreQueue 1 byte: not one entry fits; every block is dropped.
	blocks := int64((300 + 10 - 1) / 16)
	if ss.GetErrors != 1 || ss.Written != 0 || ss.Dropped != blocks {
		t.Fatalf("%+v: want 1 get error, none written, %d dropped", ss, blocks)
	}
}

// TestStoreQueueBound: writes the stuck store does not take wait in the
// queue up to its byte bound; the rest are dropped and counted.
func TestStoreQueueBound(t *testing.T) {
	st := &slowStore{gate: make(chan struct{}), fastGet: true}
	plain, _ := replica(t, nil, Config{})
	entry := int64(kvstore.EntrySize(16, plain.defPool.TierBlockBytes()))
	const fits = 3
	e, _ := replica(t, st, Config{StoreTimeout: time.Minute, StoreQueue: fits * entry})
	t.Cleanup(func() { st.closeOnce.Do(func() { close(st.gate) }) })
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, 300)
	run(t, e, GenRequest{Prompt: prompt, MaxTokens: 10}) // ends while the store holds its first write
	ss := e.StoreStats()
	blocks := int64((300 + 10 - 1) / 16)
	if ss.Written != 0 || ss.Dropped != blocks-fits || ss.QueuedBytes != fits*entry {
		t.Fatalf("%+v: want none written, %d dropped, %d bytes queued", ss, blocks-fits, fits*entry)
	}
	st.closeOnce.Do(func() { close(st.gate) })
	if ss := flushed(t, e); ss.Written != fits {
		t.Fatalf("gate open: %+v, want %d written", ss, fits)
	}
}

// TestStoreCompressed: a compressed prefix (the tables a policy left, its
// state, the logits) written by replica A starts replica B's request with
// the same prompt and kv settings, which computes none of it (or, with a
// prefix compressed on its own, only the rest), with A's output; B caches
// it locally. A damaged entry is refused, counted, and recomputed.
func TestStoreCompressed(t *testing.T) {
	srv := redistest.Start(t)
	const T, gen = 300, 12
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, T)
	a, _ := replica(t, openStore(t, srv.URL()), Config{PrefillChunk: 64})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rc.Close()
	for _, c := range []struct {
		name   string
		pc     policy.Config
		kv     string
		prefix int
	}{
		{"snapkv", policy.Config{Method: "snapkv", Ratio: 0.25}, "", 0},
		{"snapkv prefix 200", policy.Config{Method: "snapkv", Ratio: 0.25}, "", 200},
		{"tova q8", policy.Config{Method: "tova", Budget: 64}, "q8", 0},
		{"streaming", policy.Config{Method: "streaming", Window: 60, Sinks: 4}, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := GenRequest{Prompt: prompt, MaxTokens: gen, Policy: c.pc, K: c.kv, V: c.kv, PrefixTokens: c.prefix}
			k := T
			if c.prefix > 0 {
				k = c.prefix
			}
			oa := run(t, a, r)
			flushed(t, a)
			b, _ := replica(t, openStore(t, srv.URL()), Config{PrefillChunk: 64})
			ob := run(t, b, r)
			if u := ob.usage; u.StoreTokens != k || u.CompressedTokens != k || u.CachedTokens != 0 || u.ComputedTokens != T-k {
				t.Fatalf("replica B: %d store, %d compressed, %d cached, %d computed; want %d, %d, 0, %d (%+v)", u.StoreTokens, u.CompressedTokens, u.CachedTokens, u.ComputedTokens, k, k, T-k, b.StoreStats())
			}
			if !slices.Equal(ob.tokens[0], oa.tokens[0]) {
				t.Fatalf("replica B: %v, replica A %v", ob.tokens[0], oa.tokens[0])
			}
			if st := b.StoreStats(); st.HitBlocks != 1 || st.Corrupt != 0 {
				t.Fatalf("replica B: %+v, want one hit", st)
			}
			// B has it locally now.
			oc := run(t, b, r)
			if u := oc.usage; u.StoreTokens != 0 || u.CachedTokens != k || !slices.Equal(oc.tokens[0], oa.tokens[0]) {
				t.Fatalf("replica B again: %d store, %d cached; want 0, %d", u.StoreTokens, u.CachedTokens, k)
			}
			// Damaged: refused, computed, the same output.
			ns, _ := a.namespace(poolOf(t, a, c.kv))
			key := compressedKey(ns, kvcache.CompressedHash(prompt[:k], compKey(mustNormalize(t, c.pc), poolOf(t, a, c.kv))))
			orig, err := rc.Get(context.Background(), key).Bytes()
			if err != nil {
				t.Fatalf("the entry %s: %v", key, err)
			}
			bad := slices.Clone(orig)
			bad[len(bad)/2] ^= 1
			rc.Set(context.Background(), key, bad, 0)
			d, _ := replica(t, openStore(t, srv.URL()), Config{PrefillChunk: 64})
			od := run(t, d, r)
			if st := d.StoreStats(); st.Corrupt != 1 || od.usage.CompressedTokens != 0 || !slices.Equal(od.tokens[0], oa.tokens[0]) {
				t.Fatalf("damaged entry: %+v, %d compressed tokens, tokens %v; want 1 corrupt, 0, %v", st, od.usage.CompressedTokens, od.tokens[0], oa.tokens[0])
			}
		})
	}
}

func poolOf(t *testing.T, e *Engine, kv string) *kvcache.Pool {
	t.Helper()
	p, err := e.pool(kv, kv)
	if err != nil {
		t.Fatal(err)
	}
	e.ref(p, -1)
	return p
}

func mustNormalize(t *testing.T, c policy.Config) policy.Config {
	t.Helper()
	n, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The blocks a lookup fetches wait on the request until it starts; their
// bytes are bounded by Config.StoreFetchBytes over all queued requests:
// past it the lookup stops and the rest of the prompt is computed (a
// miss), and every way a request leaves the queue gives its bytes back.
func TestStoreFetchBound(t *testing.T) {
	srv := redistest.Start(t)
	const T, gen, B = 300, 4, 16
	cfg := Config{PrefillChunk: 64, KeyShiftPrompt: []int{1}}
	a, _ := replica(t, openStore(t, srv.URL()), cfg)
	ref, _ := replica(t, nil, cfg)
	_, tok := loadStories(t)
	prompt := longPrompt(t, tok, T)
	r := GenRequest{Prompt: prompt, MaxTokens: gen, K: "f32", V: "f32"}
	want := run(t, ref, r).tokens[0]
	run(t, a, r)
	flushed(t, a)
	pool, err := a.pool("f32", "f32")
	if err != nil {
		t.Fatal(err)
	}
	a.ref(pool, -1)
	entry := int64(kvstore.EntrySize(B, pool.TierBlockBytes()))
	full := (T - 1) / B
	for _, tc := range []struct {
		name  string
		bound int64
		want  int // blocks loaded
	}{
		{"three blocks", 3 * entry, 3},
		{"less than one block", entry - 1, 0},
		{"every block", int64(full) * entry, full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.StoreFetchBytes = tc.bound
			b, _ := replica(t, openStore(t, srv.URL()), c)
			b0 := b.StoreStats()
			o := run(t, b, r)
			sb := storeDelta(b0, b.StoreStats())
			if u := o.usage; u.StoreTokens != tc.want*B || u.ComputedTokens != T-tc.want*B {
				t.Fatalf("%d store tokens, %d computed; want %d, %d", u.StoreTokens, u.ComputedTokens, tc.want*B, T-tc.want*B)
			}
			if sb.HitBlocks != int64(tc.want) || sb.MissBlocks != int64(full-tc.want) {
				t.Fatalf("%+v; want %d hits, %d misses", sb, tc.want, full-tc.want)
			}
			if !slices.Equal(o.tokens[0], want) {
				t.Fatalf("tokens %v; want %v", o.tokens[0], want)
			}
			if h := b.fetchHeld.Load(); h != 0 {
				t.Fatalf("%d fetched bytes still held after the request ended", h)
			}
		})
	}
	t.Run("queued and cancelled", func(t *testing.T) {
		c := cfg
		c.StoreFetchBytes = int64(full) * entry
		c.MaxRunning = 1
		b, _ := replica(t, openStore(t, srv.URL()), c)
		// A long request runs; the next waits with its fetched blocks and
		// is cancelled there; a third, submitted while the second still
		// holds the whole bound, fetches nothing.
		long := GenRequest{Prompt: slices.Clone(longPrompt(t, tok, 400)[250:290]), MaxTokens: 400} // shares no block with prompt
		hl, err := b.Submit(long)
		if err != nil {
			t.Fatal(err)
		}
		h2, err := b.Submit(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.fetchHeld.Load(); got != int64(full)*entry {
			t.Fatalf("a queued request holds %d fetched bytes; want %d", got, int64(full)*entry)
		}
		h3, err := b.Submit(r)
		if err != nil {
			t.Fatal(err)
		}
		h2.Cancel()
		collect(t, h2)
		hl.Cancel()
		collect(t, hl)
		u3 := collect(t, h3).usage
		if u3.StoreTokens != 0 {
			t.Fatalf("the third request loaded %d tokens from the store; the bound was taken by the second", u3.StoreTokens)
		}
		if h := b.fetchHeld.Load(); h != 0 {
			t.Fatalf("%d fetched bytes still held after every request ended", h)
		}
	})
}
