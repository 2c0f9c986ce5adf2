package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
)

// GenRequest is one generation submitted to the Engine: N samples of one
// prompt.
type GenRequest struct {
	Prompt     []int         // token ids (BOS included when wanted); shorter than the context
	MaxTokens  int           // new tokens per sample, > 0 (the context also ends a sample)
	StopTokens []int         // ids that end a sample (not emitted): EOS and the like
	Sampling   sample.Params // per sample; sample i draws with seed Seed+i
	N          int           // samples (0 means 1); they share the prompt's KV blocks
	Policy     policy.Config // KV compression (Method "" or "full": none)
	K, V       string        // KV codec names ("" = the engine's default)
	// NoPrefixCache neither reuses cached prompt blocks nor leaves this
	// request's blocks for later ones.
	NoPrefixCache bool
	// PrefixTokens, if set (1 ≤ PrefixTokens ≤ len(Prompt), with a
	// Policy), compresses the prompt's first PrefixTokens tokens on their
	// own, query-agnostic, as if they were the whole prompt (SnapKV's
	// observation window is their last tokens), caches the compressed
	// prefix for later requests with the same prefix and kv settings, and
	// runs the rest of the prompt on top of it, uncompressed, as steps of
	// the method's decoding schedule. 0: the whole prompt is compressed.
	PrefixTokens int
	// Slot, if set, keeps the first sample's sequence in that slot when it
	// finishes (replacing what the slot held), for SaveSlot.
	Slot *int
}

// FinishReason says why a sample ended.
type FinishReason string

const (
	FinishEOS       FinishReason = "eos"       // a stop token was sampled
	FinishLength    FinishReason = "length"    // MaxTokens were generated
	FinishContext   FinishReason = "context"   // the context (or the whole KV pool) is full
	FinishStopped   FinishReason = "stop"      // the caller stopped it (a stop string matched)
	FinishCancelled FinishReason = "cancelled" // the request was cancelled
	FinishError     FinishReason = "error"     // see Event.Err
)

// Event is one thing that happened to a request: a new token of a sample,
// or the end of a sample.
type Event struct {
	Choice int          // sample index
	Token  int          // the new token, when !Done
	Done   bool         // the sample ended
	Finish FinishReason // why, when Done
	Err    error        // when Finish is FinishError
}

// Usage is what a request used, final once every sample ended.
type Usage struct {
	PromptTokens     int   // prompt length
	CachedTokens     int   // prompt tokens served from the prefix cache
	StoreTokens      int   // prompt tokens loaded from the shared KV tier (Config.Store)
	ComputedTokens   int   // prompt tokens run through the model (after a preemption, the recomputed ones too)
	CompressedTokens int   // prompt tokens that came from a compressed prefix (all of them, or none)
	CompletionTokens int   // tokens generated over all samples
	KVBytesPeak      int64 // the most KV memory the request's sequences held together
	KVBytes          int64 // KV memory held when the last sample ended (before release)
	EvictedTokens    int   // tokens the policy dropped (mean over (layer, KV head) tables)
	Preemptions      int   // times a sample was evicted and recomputed
	K, V             string
	Policy           string
}

// Handle follows a submitted request. It is safe for concurrent use.
type Handle struct {
	n      int
	wake   func()
	notify chan struct{}

	mu     sync.Mutex
	events []Event
	ended  int // samples whose Done event was delivered by Next
	usage  Usage

	cancelled atomic.Bool
	stopped   []atomic.Bool
}

func newHandle(n int, wake func()) *Handle {
	return &Handle{n: n, wake: wake, notify: make(chan struct{}, 1), stopped: make([]atomic.Bool, n)}
}

// N is the number of samples.
func (h *Handle) N() int { return h.n }

func (h *Handle) push(ev Event) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event; io.EOF once every sample has ended and its
// events were read; ctx's error if ctx ends first (the request goes on:
// Cancel it).
func (h *Handle) Next(ctx context.Context) (Event, error) {
	for {
		h.mu.Lock()
		if len(h.events) > 0 {
			ev := h.events[0]
			h.events[0] = Event{}
			h.events = h.events[1:]
			if ev.Done {
				h.ended++
			}
			h.mu.Unlock()
			return ev, nil
		}
		if h.ended >= h.n {
			h.mu.Unlock()
			return Event{}, io.EOF
		}
		h.mu.Unlock()
		select {
		case <-h.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Cancel ends every sample (FinishCancelled) and releases the request's KV
// blocks at the scheduler's next step. Safe to call more than once, and
// after the request ended.
func (h *Handle) Cancel() {
	if !h.cancelled.Swap(true) {
		h.wake()
	}
}

// StopChoice ends sample i (FinishStopped), as when a stop string matched.
func (h *Handle) StopChoice(i int) {
	if i >= 0 && i < h.n && !h.stopped[i].Swap(true) {
		h.wake()
	}
}

// Usage is the request's usage; final after Next returned io.EOF.
func (h *Handle) Usage() Usage {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.usage
}

func (h *Handle) setUsage(u Usage) {
	h.mu.Lock()
	h.usage = u
	h.mu.Unlock()
}

// Errors of Submit.
var (
	// ErrQueueFull: the bounded waiting queue is full; retry later
	// (wrapped in a *CapacityError).
	ErrQueueFull = errors.New("engine: the request queue is full")
	// ErrPoolsBusy: every one of the MaxPools (K, V) codec pairs is held
	// by running requests or kept slots, and the request asks for another
	// pair; retry later (wrapped in a *CapacityError).
	ErrPoolsBusy = errors.New("engine: every KV codec pool is in use")
	// ErrKVBusy: the KV memory is taken by other sequences now; retry
	// later (wrapped in a *CapacityError; RestoreSlot).
	ErrKVBusy = errors.New("engine: not enough free KV memory now")
	// ErrClosed: the engine is shut down.
	ErrClosed = errors.New("engine: closed")
)

// DefaultRetryAfter is the RetryAfter hint of capacity errors.
const DefaultRetryAfter = time.Second

// CapacityError is a request the engine cannot take now but may take
// later: a capacity limit is reached (the waiting queue, the codec pools,
// the KV memory). It is not the client's fault, unlike *InvalidError:
// the server answers 429 or 503 with a Retry-After header. errors.Is with
// ErrQueueFull, ErrPoolsBusy or ErrKVBusy tells which limit.
type CapacityError struct {
	Err        error         // ErrQueueFull, ErrPoolsBusy or ErrKVBusy
	Msg        string        // what is full, for people
	RetryAfter time.Duration // when a retry may succeed: a hint
}

func (e *CapacityError) Error() string { return e.Msg }
func (e *CapacityError) Unwrap() error { return e.Err }

func capacity(kind error, format string, args ...any) error {
	return &CapacityError{Err: kind, Msg: fmt.Sprintf(format, args...), RetryAfter: DefaultRetryAfter}
}

// InvalidError is a request the engine can never run (bad parameters, a
// prompt too long, more KV than the pool holds): the client's fault.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

func invalid(format string, args ...any) error {
	return &InvalidError{Msg: fmt.Sprintf(format, args...)}
}
