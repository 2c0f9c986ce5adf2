package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
	"github.com/kvlm/kvlm/server"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

// kvlm chat: an interactive conversation in the terminal, with two ways to
// keep a long conversation going:
//
//   - truncate (the common practice): the whole conversation is rendered
//     each turn; when it no longer fits, whole old turns (a user message and
//     its answer) are dropped. Through the engine, the turns still there are
//     served from the prefix cache, so only new text is prefilled until a
//     drop changes the start of the prompt.
//   - stream (StreamingLLM): one sequence lives through the conversation;
//     each turn only its new text is run, and the cache keeps the first
//     --sinks tokens and the last --window, positions re-indexed inside the
//     cache: history is never encoded again and the context never fills.

type chatter interface {
	turn(user string, out io.Writer) (string, error) // the assistant's reply
	status() string                                  // KV use after the last turn
	reset() error
	close()
}

func newChat() *cobra.Command {
	var f serveFlags
	var strategy, system string
	var n, window, sinks, ctxLimit int
	var p sample.Params
	c := &cobra.Command{
		Use:   "chat -m MODEL [--strategy truncate|stream]",
		Short: "Chat with a model in the terminal, showing the KV cache in use",
		Long: `Chat in the terminal. Type a message and Enter; /reset starts over, /kv shows
the KV cache, /quit (or end of input) leaves.

Long conversations: --strategy truncate drops whole old turns when the
conversation outgrows the context (earlier turns come from the prefix
cache); --strategy stream keeps one sequence whose cache holds --sinks
first tokens and the last --window (StreamingLLM), never re-encoding history.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.model == "" {
				return errors.New("no model given: use -m MODEL")
			}
			if n <= 0 {
				return fmt.Errorf("-n must be at least 1, got %d", n)
			}
			if err := p.Validate(); err != nil {
				return err
			}
			if err := chatStrategyFlags(cmd, strategy); err != nil {
				return err
			}
			if !cmd.Flags().Changed("seed") {
				p.Seed = sample.RandomSeed()
			}
			cfg, err := f.engineConfig()
			if err != nil {
				return err
			}
			if f.model, err = resolveModel(f.model); err != nil {
				return err
			}
			m, tok, err := loadModel(f.model, f.tokenizer, f.mmap)
			if err != nil {
				return err
			}
			defer m.Close()
			cfg.KeyShiftPrompt = f.keyShiftPrompt(tok)
			format, how, err := server.ChooseFormat(f.model, tok, f.template)
			if err != nil {
				return err
			}
			if ctxLimit <= 0 || ctxLimit > m.CtxLen {
				ctxLimit = m.CtxLen
			}
			base := chatBase{m: m, tok: tok, format: format, n: n, params: p, system: system, ctx: ctxLimit}
			var ch chatter
			switch strategy {
			case "truncate":
				ch, err = newTruncChat(base, cfg)
			case "stream":
				ch, err = newStreamChat(base, cfg, sinks, window)
			default:
				err = fmt.Errorf("--strategy must be truncate or stream, got %q", strategy)
			}
			if err != nil {
				return err
			}
			defer ch.close()
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			seed := ""
			if p.Temperature > 0 {
				seed = fmt.Sprintf(", seed %d", p.Seed)
			}
			fmt.Fprintf(errOut, "kvlm chat: template %s (by %s), strategy %s, context %d tokens%s. /reset, /kv, /quit.\n", format.Name(), how, strategy, ctxLimit, seed)
			in := bufio.NewScanner(cmd.InOrStdin())
			in.Buffer(make([]byte, 64<<10), 1<<20)
			for {
				fmt.Fprint(out, "> ")
				if !in.Scan() {
					fmt.Fprintln(out)
					return in.Err()
				}
				line := strings.TrimSpace(in.Text())
				switch line {
				case "":
					continue
				case "/quit", "/exit":
					return nil
				case "/kv":
					fmt.Fprintln(errOut, ch.status())
					continue
				case "/reset":
					if err := ch.reset(); err != nil {
						return err
					}
					fmt.Fprintln(errOut, "[conversation reset]")
					continue
				}
				if _, err := ch.turn(line, out); err != nil {
					fmt.Fprintf(errOut, "kvlm: %v\n", oneLine(err))
					continue
				}
				fmt.Fprintln(out)
				fmt.Fprintln(errOut, ch.status())
			}
		},
	}
	f.registerChat(c)
	fl := c.Flags()
	fl.StringVar(&strategy, "strategy", "truncate", "long conversations: truncate (drop old turns) or stream (sinks + window, never re-encode)")
	fl.StringVar(&system, "system", "", "system message")
	fl.IntVarP(&n, "n", "n", 256, "most tokens per reply")
	fl.IntVar(&ctxLimit, "context", 0, "truncate: tokens a conversation may take (default: the model's context)")
	fl.IntVar(&window, "window", 0, "stream: recent tokens kept (default: half the context)")
	fl.IntVar(&sinks, "sinks", 4, "stream: first tokens kept")
	fl.Float32Var(&p.Temperature, "temp", 0.8, "temperature (0 = greedy)")
	fl.Float32Var(&p.TopP, "top-p", 0.9, "nucleus sampling threshold (1 = off)")
	fl.Float32Var(&p.RepeatPenalty, "repeat-penalty", 1, "repetition penalty (1 = off)")
	fl.Uint64Var(&p.Seed, "seed", 0, "random seed (default: a fresh one each run, printed at the start)")
	return c
}

// registerChat registers the engine flags that kvlm chat uses, in chat's
// words. One conversation runs at a time: the batch and queue of kvlm serve
// are fixed at one.
func (f *serveFlags) registerChat(c *cobra.Command) {
	fl := c.Flags()
	f.registerShared(c)
	fl.StringVar(&f.kvMem, "kv-mem", "", "truncate: KV byte budget of the conversation and its prefix cache, e.g. 16MiB (default: one full context)")
	fl.StringVar(&f.kvType, "kv-type", "f32", "KV codec for keys and values")
	fl.StringVar(&f.kvTypeK, "kv-type-k", "", "codec of the keys (overrides --kv-type)")
	fl.StringVar(&f.kvTypeV, "kv-type-v", "", "codec of the values (overrides --kv-type)")
	fl.IntVar(&f.chunk, "chunk", model.DefaultChunk, "truncate: prompt tokens prefilled per step")
	f.maxRunning, f.maxQueue = 1, 1
}

// chatStrategyFlags refuses the flags of the strategy not chosen: they
// would be accepted and ignored.
func chatStrategyFlags(cmd *cobra.Command, strategy string) error {
	only := map[string][]string{
		"truncate": {"kv-mem", "chunk", "context"},
		"stream":   {"window", "sinks"},
	}
	for s, names := range only {
		if s == strategy {
			continue
		}
		for _, n := range names {
			if cmd.Flags().Changed(n) {
				return fmt.Errorf("--%s applies to --strategy %s only", n, s)
			}
		}
	}
	return nil
}

// chatBase is what both strategies share.
type chatBase struct {
	m      *model.Model
	tok    tokenizer.Tokenizer
	format server.ChatFormat
	n      int
	params sample.Params
	system string
	ctx    int
}

func (b *chatBase) start() []chat.Message {
	if b.system == "" {
		return nil
	}
	return []chat.Message{{Role: "system", Content: b.system}}
}

// truncChat renders the whole conversation each turn, through the engine.
type truncChat struct {
	chatBase
	e       *engine.Engine
	msgs    []chat.Message
	turns   int // turns since the start or the last /reset
	draws   int // replies drawn in all: turn i of the run samples with seed+i
	dropped int
	last    engine.Usage
	prompt  int
}

func newTruncChat(b chatBase, cfg engine.Config) (*truncChat, error) {
	cfg.MaxRunning = 1
	e, err := engine.New(b.m, cfg)
	if err != nil {
		return nil, err
	}
	return &truncChat{chatBase: b, e: e, msgs: b.start()}, nil
}

func (c *truncChat) close() { c.e.Close() }
func (c *truncChat) reset() error {
	c.msgs, c.dropped, c.turns, c.last, c.prompt = c.start(), 0, 0, engine.Usage{}, 0
	return nil
}

func (c *truncChat) turn(user string, out io.Writer) (string, error) {
	msgs := append(c.msgs, chat.Message{Role: "user", Content: user})
	room := min(c.n, c.ctx/4) // the reply's share of the context
	// Drop the oldest whole turns after the system message until it fits.
	ids, msgs, dropped, err := server.FitTurns(c.format, c.tok, msgs, c.ctx, room)
	if err != nil {
		return "", err
	}
	c.dropped += dropped
	p := c.params
	p.Seed += uint64(c.draws)
	c.draws++
	h, err := c.e.Submit(engine.GenRequest{Prompt: ids, MaxTokens: min(c.n, c.m.CtxLen-len(ids)), StopTokens: c.format.StopIDs(c.tok), Sampling: p})
	if err != nil {
		return "", err
	}
	defer h.Cancel()
	ts := server.NewTextStream(c.tok, ids[len(ids)-1], c.format.Stops())
	var reply strings.Builder
	for {
		ev, err := h.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
		if ev.Done {
			if ev.Err != nil {
				return "", ev.Err
			}
			continue
		}
		piece, stopped := ts.Add(ev.Token)
		reply.WriteString(piece)
		fmt.Fprint(out, piece)
		if stopped {
			h.StopChoice(0)
		}
	}
	rest := ts.Flush()
	reply.WriteString(rest)
	fmt.Fprint(out, rest)
	c.turns++
	c.last, c.prompt = h.Usage(), len(ids)
	c.msgs = append(msgs, chat.Message{Role: "assistant", Content: reply.String()})
	return reply.String(), nil
}

func (c *truncChat) status() string {
	u := c.last
	st := c.e.Stats()
	return fmt.Sprintf("[kv: prompt %d tokens, %d from the prefix cache, %d generated; %s peak; pool %s of %s in use, %s cached for reuse; %d old turns dropped to fit %d tokens]",
		u.PromptTokens, u.CachedTokens, u.CompletionTokens, humanBytes(u.KVBytesPeak), humanBytes(st.UsedBytes), humanBytes(st.BudgetBytes),
		humanBytes(cachedBytes(st)), c.dropped, c.ctx)
}

func cachedBytes(st engine.Stats) int64 {
	var n int64
	for _, p := range st.Pools {
		n += int64(p.Cached) * int64(p.BlockBytes)
	}
	return n
}

// streamChat keeps one sequence under the streaming policy.
type streamChat struct {
	chatBase
	cfg           engine.Config
	sinks, window int
	seq           *model.Sequence
	pol           *policy.State
	smp           *sample.Sampler
	msgs          []chat.Message
	inCache       string // the conversation's text as run so far
	hist          []int  // every token run
	logits        []float32
	turns         int         // turns since the start or the last /reset
	resets        int         // samplers made: each reset draws with the next seed
	keyMeans      [][]float32 // q8/q4 key shift (cfg.KeyShiftPrompt), computed once
}

func newStreamChat(b chatBase, cfg engine.Config, sinks, window int) (*streamChat, error) {
	if window <= 0 {
		window = b.m.CtxLen / 2
	}
	if sinks < 0 || sinks+window >= b.m.CtxLen {
		return nil, fmt.Errorf("--sinks %d + --window %d must be below the context length %d", sinks, window, b.m.CtxLen)
	}
	c := &streamChat{chatBase: b, cfg: cfg, sinks: sinks, window: window}
	return c, c.reset()
}

func (c *streamChat) feedChunk() int { return max(1, c.window/2) }

func (c *streamChat) reset() error {
	if c.seq != nil {
		c.seq.Close()
	}
	k, err := codec.Parse(c.cfg.K, codec.Keys)
	if err != nil {
		return err
	}
	v, err := codec.Parse(c.cfg.V, codec.Values)
	if err != nil {
		return err
	}
	if c.keyMeans == nil && len(c.cfg.KeyShiftPrompt) > 0 && k.Shiftable() {
		if c.keyMeans, err = c.m.KeyMeans(c.cfg.KeyShiftPrompt, 0, 1); err != nil {
			return fmt.Errorf("key means for %s keys: %w", k.Name(), err)
		}
	}
	seq, err := c.m.NewStandaloneSequence(model.KVOptions{BlockTokens: c.cfg.BlockTokens, K: k, V: v,
		Tokens: c.sinks + c.window + c.feedChunk() + 2*c.cfg.BlockTokens, KeyShift: c.keyMeans})
	if err != nil {
		return err
	}
	pol, err := policy.New(policy.Config{Method: "streaming", Sinks: c.sinks, Window: c.window}, seq)
	if err != nil {
		seq.Close()
		return err
	}
	p := c.params
	p.Seed += uint64(c.resets)
	c.resets++
	smp, err := sample.New(p)
	if err != nil {
		seq.Close()
		return err
	}
	seq.SetPolicy(pol) // the forward pass drives it
	c.seq, c.pol, c.smp, c.turns = seq, pol, smp, 0
	c.msgs, c.inCache, c.hist, c.logits = c.start(), "", nil, nil
	return nil
}

func (c *streamChat) close() {
	if c.seq != nil {
		c.seq.Close()
	}
}

// feed runs tokens through the sequence, the policy making room first.
func (c *streamChat) feed(ids []int) error {
	for len(ids) > 0 {
		k := min(len(ids), c.feedChunk()) // the policy makes room for them first
		l, err := c.seq.Forward(ids[:k], false)
		if err != nil {
			return err
		}
		c.logits = l
		c.hist = append(c.hist, ids[:k]...)
		ids = ids[k:]
	}
	return nil
}

func (c *streamChat) turn(user string, out io.Writer) (string, error) {
	msgs := append(c.msgs, chat.Message{Role: "user", Content: user})
	full, err := c.format.Render(msgs)
	if err != nil {
		return "", err
	}
	// Only what the sequence has not run: the rendering's suffix past what
	// it holds (the previous turns, the replies as generated).
	same := 0
	for same < len(full) && same < len(c.inCache) && full[same] == c.inCache[same] {
		same++
	}
	ids := c.format.EncodeText(c.tok, full[same:], len(c.hist) == 0)
	if len(ids) == 0 {
		return "", errors.New("nothing new to say")
	}
	if err := c.feed(ids); err != nil {
		return "", err
	}
	stops := c.format.StopIDs(c.tok)
	ts := server.NewTextStream(c.tok, c.hist[len(c.hist)-1], c.format.Stops())
	var reply strings.Builder
	for range c.n {
		id := c.smp.Sample(c.logits, c.hist)
		if id < 0 || containsInt(stops, id) {
			break
		}
		piece, stopped := ts.Add(id)
		reply.WriteString(piece)
		fmt.Fprint(out, piece)
		if err := c.feed([]int{id}); err != nil {
			return "", err
		}
		if stopped {
			break
		}
	}
	rest := ts.Flush()
	reply.WriteString(rest)
	fmt.Fprint(out, rest)
	c.turns++
	c.msgs = append(msgs, chat.Message{Role: "assistant", Content: reply.String()})
	c.inCache = full + reply.String()
	return reply.String(), nil
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func (c *streamChat) status() string {
	mem := c.seq.Cache().Bytes()
	return fmt.Sprintf("[kv: %d tokens in the cache (sinks %d + window %d) of %d run over %d turns, %s; history never re-encoded]",
		c.seq.Cache().Len(), c.sinks, c.window, len(c.hist), c.turns, humanBytes(mem))
}
