package engine

import (
	"errors"
	"fmt"
	"log"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
)

// request is a submitted GenRequest as the scheduler tracks it.
type request struct {
	id        uint64
	r         GenRequest
	h         *Handle
	pool      *kvcache.Pool
	submitted time.Time

	choices  []*seqState // by sample index, once created (choice 0 at admission, the others at the fork)
	forked   bool        // samples 1..N-1 exist
	ended    []bool      // by sample index
	live     int         // samples not ended
	firstTok bool
	started  bool // admitted once (prefix-cache statistics counted)
	usage    Usage
	evicted  int64 // slots dropped by the policy, summed over tables
	// streamed: the prompt is longer than the context and the policy a
	// window method: it is fed token by token, each token a step of the
	// method's decoding schedule (as kvlm ppl --stream feeds a text), and
	// the cache never holds more than the policy's StreamBound.
	streamed bool
	curBytes int64
	fetched  *fetched // the shared tier's blocks of the prompt, until the request starts (kvstore.go)
	// storeComp: the request started from a compressed prefix the shared
	// tier had (startFetchedCompressed).
	storeComp bool
}

// admitTokens is the tokens of a history of n that admission sizes the
// cache for: n, or the policy's bound for a streamed request.
func (q *request) admitTokens(n int) int {
	if q.streamed {
		b, _ := q.r.Policy.StreamBound()
		return min(n, b)
	}
	return n
}

// prefix says whether the request starts from cached prompt blocks. A
// request with a policy does too, for as much of its prompt as the method
// allows (policy.Config.ComputedTail: what it must compute itself to
// compress as a whole prefill would); the blocks it then compresses are
// copied first (kvcache copies blocks shared with other sequences or the
// prefix cache before it changes them), so the cached prefix stays whole.
func (q *request) prefix() bool { return !q.r.NoPrefixCache && !q.streamed }

// registers says whether the request leaves its prompt's blocks in the
// prefix cache: only uncompressed ones hold tokens 0..n-1 in order (a
// policy compresses the prompt in the forward pass of its last chunk).
func (q *request) registers() bool { return q.prefix() && q.r.Policy.Method == "full" }

// seqState is one sample.
type seqState struct {
	req    *request
	choice int
	seq    *model.Sequence // nil while waiting (preempted)
	cache  kvcache.Scheduled
	pol    *policy.State
	smp    *sample.Sampler

	hist       []int     // prompt, then the tokens generated
	restored   []float32 // [vocab] the last prompt token's logits, when the prompt came from a compressed prefix
	lastLogits []float32 // [vocab] the logits the last token was sampled from (requests keeping a slot), valid until the next step
	gen        int       // tokens generated
	fed        int       // leading tokens of hist in the cache
	prefilling bool      // the next run is a prefill of hist[fed:]
	last       time.Time
	done       bool
	bytes      int64 // KV bytes after the last step
	stored     int   // leading prefix blocks of cache already queued for the shared tier (or not to be)
}

func (s *seqState) newer(t *seqState) bool {
	if s.req.id != t.req.id {
		return s.req.id > t.req.id
	}
	return s.choice > t.choice
}

func (e *Engine) loop() {
	defer close(e.doneCh)
	for {
		e.mu.Lock()
		closed := e.closed
		ctl := e.control
		e.control = nil
		idle := len(e.waiting) == 0 && len(ctl) == 0
		e.mu.Unlock()
		for _, f := range ctl {
			e.safely(f)
		}
		if closed {
			e.safely(e.shutdown)
			return
		}
		if idle && len(e.running) == 0 && len(e.preempted) == 0 {
			<-e.wakeCh
			continue
		}
		e.safely(e.step)
		// Let the goroutines this step woke (the requests' token streams)
		// run now: during decode the tensor pool's workers spin between
		// parallel regions, so no processor is idle for them. Measured with
		// a decode-like loop of 110 regions a step sending on a channel
		// after each: the receiver ran 0.65–0.86 ms late (median; 90th
		// percentile ~4 ms, worst 7–22 ms) without this, 2 µs with it (the
		// pool of before session 8: 74 µs, 0.5 ms, 3.7 ms).
		runtime.Gosched()
	}
}

// safely runs fn; a panic (a bug) fails every sample in flight instead of
// taking the process down.
func (e *Engine) safely(fn func()) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		log.Printf("kvlm engine: internal error: %v\n%s", p, debug.Stack())
		err := fmt.Errorf("engine: internal error: %v", p)
		for _, s := range slices.Concat(e.running, e.preempted) {
			func() {
				defer func() { recover() }()
				e.finish(s, FinishError, err)
			}()
		}
		e.running, e.preempted = nil, nil
		e.gauges()
	}()
	fn()
}

// step is one scheduler iteration.
func (e *Engine) step() {
	start := time.Now()
	e.stepGen = 0
	e.reap()
	e.admit()
	dec := e.decode()
	pre := e.prefill()
	e.gauges()
	if dec+pre > 0 {
		e.obs.Step(pre, e.stepGen, time.Since(start))
	}
}

func (e *Engine) gauges() {
	e.nRunning.Store(int64(e.runningSamples()))
	pre := len(e.preempted)
	e.mu.Lock()
	e.nWaiting.Store(int64(len(e.waiting) + pre))
	e.mu.Unlock()
}

// reap ends cancelled requests and stopped samples, releasing their blocks.
func (e *Engine) reap() {
	for _, s := range slices.Concat(e.running, e.preempted) {
		switch {
		case s.req.h.cancelled.Load():
			e.finish(s, FinishCancelled, nil)
		case s.req.h.stopped[s.choice].Load():
			e.finish(s, FinishStopped, nil)
		}
	}
	e.mu.Lock()
	var gone []*request
	e.waiting = slices.DeleteFunc(e.waiting, func(q *request) bool {
		if q.h.cancelled.Load() {
			gone = append(gone, q)
			return true
		}
		return false
	})
	e.mu.Unlock()
	for _, q := range gone {
		e.endRequest(q, FinishCancelled, nil)
	}
}

// endRequest ends every sample of a request that never started.
func (e *Engine) endRequest(q *request, why FinishReason, err error) {
	e.dropFetched(q.fetched)
	q.fetched = nil
	if q.ended == nil {
		q.ended = make([]bool, q.r.N)
		q.live = q.r.N
	}
	for i := range q.r.N {
		e.endChoice(q, i, why, err)
	}
}

// endChoice delivers the end of sample i (once).
func (e *Engine) endChoice(q *request, i int, why FinishReason, err error) {
	if q.ended[i] {
		return
	}
	q.ended[i] = true
	q.live--
	e.obs.Finished(why, time.Since(q.submitted))
	if q.live == 0 {
		q.usage.EvictedTokens = int(q.evicted / int64(e.tables))
		q.h.setUsage(q.usage)
		e.ref(q.pool, -1)
	}
	q.h.push(Event{Choice: i, Done: true, Finish: why, Err: err})
}

// finish ends a sample: its blocks are released (kept in the prefix
// cache when allowed, or in a slot), and the end is delivered.
func (e *Engine) finish(s *seqState, why FinishReason, err error) {
	if s.done {
		return
	}
	s.done = true
	q := s.req
	e.running = slices.DeleteFunc(e.running, func(t *seqState) bool { return t == s })
	e.preempted = slices.DeleteFunc(e.preempted, func(t *seqState) bool { return t == s })
	if s.cache != nil {
		q.usage.KVBytes += s.cache.Bytes()
		kept := false
		if why != FinishError && why != FinishCancelled {
			if q.registers() {
				e.registerPrefix(s)
			}
			if q.r.Slot != nil && s.choice == 0 {
				kept = e.keepSlot(*q.r.Slot, s)
			}
		}
		if !kept {
			s.cache.Free()
		}
		s.seq, s.cache, s.pol = nil, nil, nil
	}
	if !q.forked {
		// Samples 1..N-1 do not exist yet: they end with sample 0.
		e.endRequest(q, why, err)
		return
	}
	e.endChoice(q, s.choice, why, err)
}

// places is how many of MaxRunning's places s takes: every sample of its
// request until samples 1..N-1 are forked from it (after its prefill),
// then its own.
func places(s *seqState) int {
	if s.choice == 0 && !s.req.forked {
		return s.req.r.N
	}
	return 1
}

// runningSamples is the places the running samples take (MaxRunning):
// a request with n > 1 counts n from its admission on.
func (e *Engine) runningSamples() int {
	n := 0
	for _, s := range e.running {
		n += places(s)
	}
	return n
}

// admit starts preempted samples, then waiting requests, while the KV
// budget and MaxRunning allow.
func (e *Engine) admit() {
	for len(e.preempted) > 0 {
		s := e.preempted[0]
		if e.runningSamples()+places(s) > e.cfg.MaxRunning || !e.fits(s.req.pool, s.req.pool.AdmitBytesStep(s.req.admitTokens(len(s.hist)), places(s), e.cfg.PrefillChunk)) {
			return
		}
		e.preempted = e.preempted[1:]
		e.start(s)
	}
	for {
		e.mu.Lock()
		if len(e.waiting) == 0 {
			e.mu.Unlock()
			return
		}
		q := e.waiting[0]
		e.mu.Unlock()
		if e.runningSamples()+q.r.N > e.cfg.MaxRunning || !e.fits(q.pool, q.pool.AdmitBytesStep(q.admitTokens(len(q.r.Prompt)), q.r.N, e.cfg.PrefillChunk)) {
			return
		}
		e.mu.Lock()
		e.waiting = e.waiting[1:]
		e.mu.Unlock()
		q.ended = make([]bool, q.r.N)
		q.live = q.r.N
		smp, err := samplerFor(q.r.Sampling, 0)
		if err != nil {
			e.endRequest(q, FinishError, err)
			continue
		}
		s := &seqState{req: q, choice: 0, smp: smp, hist: slices.Clone(q.r.Prompt)}
		q.choices = []*seqState{s}
		e.start(s)
	}
}

func samplerFor(p sample.Params, i int) (*sample.Sampler, error) {
	if p.Seed == 0 {
		p.Seed = sample.DefaultSeed
	}
	p.Seed += uint64(i)
	return sample.New(p)
}

// fits reports whether need more bytes of pool p fit the budget (keeping
// 1% spare while others run). Kept slots are released when that makes
// room. With nothing running, anything Submit accepted fits.
func (e *Engine) fits(p *kvcache.Pool, need int64) bool {
	spare := e.budget / 100
	if len(e.running) == 0 {
		spare = 0
	}
	if e.room(p, need+spare) {
		return true
	}
	if e.releaseSlots() && e.room(p, need+spare) {
		return true
	}
	return len(e.running) == 0 && len(e.preempted) == 0
}

// room reports whether need more bytes of pool p fit: within the budget
// (bytes referenced in every pool), and within what p can still take
// from the arena (which goes by chunks).
func (e *Engine) room(p *kvcache.Pool, need int64) bool {
	return e.usedBytes()+need <= e.budget && need <= p.ObtainableBytes()
}

// start gives a sample a fresh sequence: cached prompt blocks are taken
// from the prefix cache, the rest is prefilled in later steps. A request
// with a policy whose whole prompt was compressed before under the same
// configuration starts from that compressed prefix and computes nothing
// of it.
func (e *Engine) start(s *seqState) {
	q := s.req
	cache := q.pool.NewSequence()
	k := s.compressedLen()
	if q.prefix() && q.r.Policy.Method != "full" && (e.startFromSlot(s, cache, k) || e.startCompressed(s, cache, k) || e.startFetchedCompressed(s, cache, k)) {
		e.dropFetched(q.fetched)
		q.fetched = nil
		return
	}
	matched := 0
	if q.prefix() {
		// At least the method's computed tail of the part it compresses
		// is left to run (MatchPrefix always leaves one token).
		tail := q.r.Policy.ComputedTail(k)
		matched = cache.MatchPrefix(s.hist[:k-tail+1], 0)
	}
	local := matched
	if q.fetched != nil {
		stored := e.loadFetched(q, cache, s.hist, matched)
		matched += stored
		q.usage.StoreTokens = stored
	}
	if !q.started {
		q.started = true
		q.usage.CachedTokens = local
		e.prefixQueried.Add(int64(len(s.hist)))
		e.prefixHit.Add(int64(local))
	}
	s.stored = cache.PrefixBlocks() // what the store has or the local cache had
	seq, err := e.m.NewSequence(cache)
	if err != nil {
		cache.Free()
		e.finish(s, FinishError, err)
		return
	}
	seq.Chunk = e.cfg.PrefillChunk
	s.seq, s.cache, s.fed, s.prefilling = seq, cache, matched, true
	if q.r.Policy.Method != "full" {
		st, err := policy.New(q.r.Policy, seq)
		if err != nil {
			cache.Free()
			s.seq, s.cache = nil, nil
			e.finish(s, FinishError, err)
			return
		}
		s.pol = st
		seq.SetPolicy(st) // the forward pass drives it
		if !q.streamed {
			seq.Prompt(k - matched)
		}
	}
	e.running = append(e.running, s)
}

// compressedLen is how many leading tokens of s's history the policy
// compresses as a prompt: the request's PrefixTokens (a prefix compressed
// on its own, the rest run on top of it), else the whole history.
func (s *seqState) compressedLen() int {
	if k := s.req.r.PrefixTokens; k > 0 {
		return k
	}
	return len(s.hist)
}

// preempt frees a sample's blocks and queues it to be recomputed.
func (e *Engine) preempt(s *seqState) {
	q := s.req
	if s.cache != nil {
		if q.registers() && !s.prefilling {
			e.registerPrefix(s)
		}
		s.cache.Free()
	}
	s.seq, s.cache, s.pol, s.bytes = nil, nil, nil, 0
	s.fed, s.prefilling = 0, true
	e.running = slices.DeleteFunc(e.running, func(t *seqState) bool { return t == s })
	i, _ := slices.BinarySearchFunc(e.preempted, s, func(a, b *seqState) int {
		if b.newer(a) {
			return -1
		}
		return 1
	})
	e.preempted = slices.Insert(e.preempted, i, s)
	q.usage.Preemptions++
	e.preemptions.Add(1)
	e.obs.Preempted()
}

// newest is the newest running sample other than skip (nil if none).
func (e *Engine) newest(skip *seqState) *seqState {
	var v *seqState
	for _, s := range e.running {
		if s != skip && (v == nil || s.newer(v)) {
			v = s
		}
	}
	return v
}

// makeRoom preempts samples newer than s until n more tokens of s fit the
// budget. It returns false when s itself must wait (it was preempted) or
// end (it could never fit).
func (e *Engine) makeRoom(s *seqState, n int) bool {
	for {
		if e.room(s.req.pool, s.cache.Need(n)) {
			return true
		}
		if e.releaseSlots() {
			continue
		}
		v := e.newest(s)
		if v == nil {
			// Alone, and the pool cannot hold one more token.
			e.finish(s, FinishContext, nil)
			return false
		}
		if s.newer(v) {
			e.preempt(s)
			return false
		}
		e.preempt(v)
	}
}

// batchFits reports whether one more token of every sample of batch fits
// the budget together, and each pool's part what the pool can take.
func (e *Engine) batchFits(batch []*seqState) bool {
	var total int64
	need := map[*kvcache.Pool]int64{}
	for _, s := range batch {
		n := s.cache.Need(1)
		total += n
		need[s.req.pool] += n
	}
	if e.usedBytes()+total > e.budget {
		return false
	}
	for p, n := range need {
		if n > p.ObtainableBytes() {
			return false
		}
	}
	return true
}

// decode runs one token of every sample past its prefill, as one batch.
func (e *Engine) decode() int {
	var batch []*seqState
	for _, s := range e.running {
		if !s.prefilling {
			batch = append(batch, s)
		}
	}
	if len(batch) == 0 {
		return 0
	}
	// Policies prune before the step (no new blocks, except copies of
	// shared ones), prepared here so that the room the step needs is
	// measured after.
	for _, s := range batch {
		if s.pol == nil || s.done {
			continue
		}
		before := e.slotsHeld(s)
		if err := s.seq.Prepare(1); err != nil {
			if errors.Is(err, kvcache.ErrNoBlocks) {
				e.preempt(s)
			} else {
				e.finish(s, FinishError, err)
			}
			continue
		}
		e.noteEvicted(s, before)
	}
	// Room for one token each, newest preempted first.
	for _, s := range slices.Clone(batch) {
		if s.done || s.seq == nil || s.prefilling {
			continue
		}
		e.makeRoom(s, 1)
	}
	var seqs []*model.Sequence
	var toks []int
	batch = slices.DeleteFunc(batch, func(s *seqState) bool { return s.done || s.seq == nil || s.prefilling })
	if len(batch) == 0 {
		return 0
	}
	// One more check of the whole batch together.
	for len(batch) > 1 && !e.batchFits(batch) {
		v := batch[len(batch)-1]
		for _, s := range batch {
			if s.newer(v) {
				v = s
			}
		}
		e.preempt(v)
		batch = slices.DeleteFunc(batch, func(s *seqState) bool { return s == v })
	}
	for _, s := range batch {
		seqs = append(seqs, s.seq)
		toks = append(toks, s.hist[len(s.hist)-1])
	}
	logits, err := e.m.DecodeBatch(seqs, toks)
	if err != nil {
		for _, s := range batch {
			if errors.Is(err, kvcache.ErrNoBlocks) {
				// Recomputed from its tokens: whatever the failed step
				// left in its cache is dropped with it.
				e.preempt(s)
			} else {
				e.finish(s, FinishError, err)
			}
		}
		return 0
	}
	for i, s := range batch {
		s.fed++
		e.emit(s, logits[i])
	}
	return len(batch)
}

// prefill runs up to PrefillChunk prompt tokens, oldest samples first.
func (e *Engine) prefill() int {
	left := e.cfg.PrefillChunk
	ran := 0
	for _, s := range slices.Clone(e.running) {
		if left <= 0 {
			break
		}
		if s.done || !s.prefilling || s.seq == nil {
			continue
		}
		q := s.req
		// A prompt that came compressed from the cache whole comes with
		// its logits.
		restored := s.restored != nil && s.fed == len(s.hist)
		logits := s.restored
		s.restored = nil
		k := s.compressedLen()
		if q.streamed {
			var ok bool
			if logits, ok = e.stream(s, &left, &ran); !ok {
				continue
			}
		} else if !restored {
			n := min(len(s.hist)-s.fed, left)
			if s.pol != nil && s.fed < k {
				n = min(n, k-s.fed) // the compressed part ends a step
			}
			if !e.makeRoom(s, n) {
				continue
			}
			var err error
			logits, err = s.seq.Forward(s.hist[s.fed:s.fed+n], false)
			if err != nil {
				if errors.Is(err, kvcache.ErrNoBlocks) && len(e.running) > 1 {
					e.preempt(s)
				} else {
					e.finish(s, FinishError, err)
				}
				continue
			}
			s.fed += n
			left -= n
			ran += n
			e.notePeak(s, s.seq.StepBytes) // before the policy compressed the prompt
			q.usage.ComputedTokens += n
			e.prefillComputed.Add(int64(n))
			if q.registers() {
				e.registerPrefix(s)
			}
			if s.pol != nil && s.fed == k && q.prefix() && !q.forked {
				// Just compressed, before the rest runs on top of it.
				e.storeCompressed(s, s.hist[:k], logits)
			}
			if s.fed < len(s.hist) {
				continue
			}
		}
		s.prefilling = false
		if s.pol != nil && !q.streamed { // (a streamed prompt's evictions are counted as they happen)
			// The forward pass compressed the prompt after its last token.
			// Every table received the whole prompt, unless the policy
			// pruned it during the prefill (pyramidinfer): count those too.
			e.noteEvicted(s, int64(s.fed)*int64(e.tables))
		}
		fresh := []*seqState{s}
		if !q.forked {
			q.forked = true
			for i := 1; i < q.r.N; i++ {
				f, err := e.fork(s, i)
				if err != nil {
					e.endChoice(q, i, FinishError, err)
					continue
				}
				fresh = append(fresh, f)
			}
		}
		for _, f := range fresh {
			e.emit(f, logits)
		}
	}
	return ran
}

// stream feeds a streamed sample's prompt one token at a time, each a
// step of the policy's decoding schedule (its Before prunes first), up to
// *left tokens. It returns the last token's logits and true once the
// prompt has been fed; false while tokens are left (or the sample was
// preempted or ended).
func (e *Engine) stream(s *seqState, left, ran *int) ([]float32, bool) {
	q := s.req
	var logits []float32
	for *left > 0 && s.fed < len(s.hist) {
		before := e.slotsHeld(s)
		if err := s.seq.Prepare(1); err != nil {
			if errors.Is(err, kvcache.ErrNoBlocks) && len(e.running) > 1 {
				e.preempt(s)
			} else {
				e.finish(s, FinishError, err)
			}
			return nil, false
		}
		e.noteEvicted(s, before)
		if !e.makeRoom(s, 1) {
			return nil, false
		}
		var err error
		if logits, err = s.seq.Forward(s.hist[s.fed:s.fed+1], false); err != nil {
			if errors.Is(err, kvcache.ErrNoBlocks) && len(e.running) > 1 {
				e.preempt(s)
			} else {
				e.finish(s, FinishError, err)
			}
			return nil, false
		}
		s.fed++
		*left--
		*ran++
		q.usage.ComputedTokens++
		e.prefillComputed.Add(1)
		e.notePeak(s, s.cache.Bytes())
	}
	return logits, s.fed == len(s.hist)
}

// fork makes sample i of s's request, sharing s's blocks.
func (e *Engine) fork(s *seqState, i int) (*seqState, error) {
	q := s.req
	smp, err := samplerFor(q.r.Sampling, i)
	if err != nil {
		return nil, err
	}
	seq, err := s.seq.Fork()
	if err != nil {
		return nil, err
	}
	f := &seqState{req: q, choice: i, seq: seq, cache: seq.Cache().(kvcache.Scheduled), smp: smp,
		hist: slices.Clone(s.hist), fed: s.fed, stored: s.stored}
	if s.pol != nil {
		if f.pol, err = policy.New(q.r.Policy, seq); err != nil {
			f.cache.Free()
			return nil, err
		}
		seq.SetPolicy(f.pol)
	}
	q.choices = append(q.choices, f)
	e.running = append(e.running, f)
	if q.h.stopped[i].Load() {
		e.finish(f, FinishStopped, nil)
	}
	return f, nil
}

// emit samples the next token of s from logits and delivers it, or ends
// the sample.
func (e *Engine) emit(s *seqState, logits []float32) {
	if s.done {
		return
	}
	q := s.req
	if q.r.Slot != nil {
		s.lastLogits = logits // for keepSlot, if this token ends the sample
		defer func() { s.lastLogits = nil }()
	}
	tok := s.smp.Sample(logits, s.hist)
	if tok < 0 {
		e.finish(s, FinishError, errors.New("engine: no token can be sampled: every logit is NaN or -Inf"))
		return
	}
	now := time.Now()
	if !q.firstTok {
		q.firstTok = true
		e.obs.FirstToken(now.Sub(q.submitted))
	}
	if !s.last.IsZero() {
		e.obs.InterToken(now.Sub(s.last))
	}
	s.last = now
	e.notePeak(s, s.cache.Bytes())
	if slices.Contains(q.r.StopTokens, tok) {
		e.finish(s, FinishEOS, nil)
		return
	}
	s.hist = append(s.hist, tok)
	s.gen++
	q.usage.CompletionTokens++
	e.stepGen++
	q.h.push(Event{Choice: s.choice, Token: tok})
	switch {
	case s.gen >= q.r.MaxTokens:
		e.finish(s, FinishLength, nil)
	case s.seq.Pos() >= s.seq.MaxPos:
		e.finish(s, FinishContext, nil)
	}
}

// notePeak records bytes, what s holds now, in its request's peak: the
// most KV memory its live samples held together after any forward step
// (the prompt's before compression included).
func (e *Engine) notePeak(s *seqState, bytes int64) {
	q := s.req
	s.bytes = bytes
	var cur int64
	for _, c := range q.choices {
		if !c.done {
			cur += c.bytes
		}
	}
	q.usage.KVBytesPeak = max(q.usage.KVBytesPeak, cur)
}

// slotsHeld is the slots of every table of s together.
func (e *Engine) slotsHeld(s *seqState) int64 {
	l := e.m.KVLayout()
	var n int64
	for layer := range l.Layers {
		for h := range l.KVHeads {
			// Tokens a window freed were not evicted by the policy.
			n += int64(s.cache.Slots(layer, h) + s.cache.WindowDropped(layer, h))
		}
	}
	return n
}

func (e *Engine) noteEvicted(s *seqState, before int64) {
	if d := before - e.slotsHeld(s); d > 0 {
		s.req.evicted += d
		e.obs.Evicted(s.req.r.Policy.Method, float64(d)/float64(e.tables))
	}
}

// shutdown ends everything and releases every block.
func (e *Engine) shutdown() {
	for _, s := range slices.Concat(e.running, e.preempted) {
		e.finish(s, FinishCancelled, ErrClosed)
	}
	e.mu.Lock()
	w := e.waiting
	e.waiting = nil
	e.mu.Unlock()
	for _, q := range w {
		e.endRequest(q, FinishCancelled, ErrClosed)
	}
	e.releaseSlots()
	e.gauges()
}
