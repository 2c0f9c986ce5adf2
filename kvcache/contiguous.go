package kvcache

import "fmt"

// Contiguous is the plainest cache: one block per (layer, KV head) sized for
// the whole context, allocated up front. It is the reference the paged
// variants are tested against.
type Contiguous struct {
	layout Layout
	cap    int
	blocks [][]*Block // [layer][kvHead], each with cap slots
	tables [][][]*Block
	last   int // layer appended to last
}

// NewContiguous allocates a cache for up to capacity tokens.
func NewContiguous(l Layout, capacity int) (*Contiguous, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if capacity <= 0 {
		return nil, fmt.Errorf("kvcache: capacity must be positive, got %d", capacity)
	}
	c := &Contiguous{layout: l, cap: capacity}
	c.blocks = make([][]*Block, l.Layers)
	c.tables = make([][][]*Block, l.Layers)
	for i := range c.blocks {
		c.blocks[i] = make([]*Block, l.KVHeads)
		c.tables[i] = make([][]*Block, l.KVHeads)
		for h := range c.blocks[i] {
			b := NewBlock(capacity, l.HeadDim)
			c.blocks[i][h] = b
			c.tables[i][h] = []*Block{b}
		}
	}
	return c, nil
}

func (c *Contiguous) Layout() Layout { return c.layout }

// Blocks returns the single block of (layer, head).
func (c *Contiguous) Blocks(layer, head int) []*Block { return c.tables[layer][head] }

// Append stores new tokens of one layer.
func (c *Contiguous) Append(layer int, pos []int32, k, v []float32) error {
	if layer < 0 || layer >= c.layout.Layers {
		return fmt.Errorf("kvcache: layer %d out of range [0,%d)", layer, c.layout.Layers)
	}
	n := len(pos)
	hd := c.layout.HeadDim
	width := c.layout.KVHeads * hd
	if len(k) != n*width || len(v) != n*width {
		return fmt.Errorf("kvcache: append of %d tokens needs %d keys and values, got %d and %d", n, n*width, len(k), len(v))
	}
	row := c.blocks[layer]
	if row[0].N+n > c.cap {
		return fmt.Errorf("%w: %d tokens stored, %d more requested, capacity %d", ErrFull, row[0].N, n, c.cap)
	}
	for h, b := range row {
		for t := 0; t < n; t++ {
			slot := b.N + t
			copy(b.K[slot*hd:(slot+1)*hd], k[t*width+h*hd:t*width+(h+1)*hd])
			copy(b.V[slot*hd:(slot+1)*hd], v[t*width+h*hd:t*width+(h+1)*hd])
			b.Pos[slot] = pos[t]
		}
		b.N += n
	}
	c.last = layer
	return nil
}

func (c *Contiguous) Len() int { return c.blocks[c.last][0].N }

// Room is the number of tokens every layer can still take.
func (c *Contiguous) Room() int {
	most := 0
	for _, row := range c.blocks {
		if row[0].N > most {
			most = row[0].N
		}
	}
	return c.cap - most
}

// Truncate keeps the first n tokens of every layer.
func (c *Contiguous) Truncate(n int) error {
	if n < 0 {
		return fmt.Errorf("kvcache: truncate to %d tokens", n)
	}
	for _, row := range c.blocks {
		for _, b := range row {
			if n < b.N {
				b.N = n
			}
		}
	}
	return nil
}

// Bytes counts the allocated storage (the whole capacity: it is reserved up
// front).
func (c *Contiguous) Bytes() int64 {
	l := c.layout
	perSlot := int64(2*l.HeadDim*4 + 4)
	return int64(l.Layers*l.KVHeads) * int64(c.cap) * perSlot
}
