package kvcache

import (
	"fmt"
	"unsafe"

	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// KIVI's full-precision residual: with a KIVI codec on either side, the
// newest tokens of a table wait in f16 (KIVI keeps its residual in half
// precision too) until residual+sealSize of them are there; then the
// oldest sealSize (a key group, quantized per channel over its tokens, or
// one block when only the values are KIVI) are sealed into fresh blocks.
// Everything a table does with its residual goes through the methods
// below; a table without one (no KIVI) has res == nil.

// residual holds the newest tokens of a table in f16, and the scratch its
// sealing decodes into.
type residual struct {
	k, v []uint16 // [cap][headDim] f16 bits
	pos  []int32  // [cap]
	n    int      // tokens held

	scratch []float32 // tokens being sealed, decoded: keys and values [2][sealSize][headDim]
	lo, hi  []float32 // per-channel range of a key group [headDim]
}

// newResidual is an empty residual of c slots.
func newResidual(c, d int) *residual {
	return &residual{k: make([]uint16, c*d), v: make([]uint16, c*d), pos: make([]int32, c)}
}

// sealSize is how many residual tokens are sealed at once: a KIVI key
// group, or one block when only the values are KIVI.
func (p *Pool) sealSize() int {
	if p.group > 0 {
		return p.group
	}
	return p.B
}

// residualSlots is the residual buffer a table keeps outside a held
// prompt.
func (p *Pool) residualSlots() int { return p.residual + p.sealSize() }

// resWindow is layer's window when its tables are never sealed
// (Footprint.Unsealed), else 0.
func (p *Pool) resWindow(layer int) int {
	if w := p.layout.window(layer); p.fp.Unsealed(w) {
		return w
	}
	return 0
}

// fit is r with room for m tokens in all (a never-sealed table's residual
// before an append): a new residual of max(w, m) slots for nil, the
// buffers grown to exactly m if they are smaller.
func (r *residual) fit(d, m, w int) *residual {
	if r == nil {
		return newResidual(max(w, m), d)
	}
	if len(r.pos) < m {
		r.grow(d, m)
	}
	return r
}

// shrink gives back the buffers' room beyond c slots when they hold at
// most c tokens.
func (r *residual) shrink(d, c int) {
	if len(r.pos) > c && r.n <= c {
		r.grow(d, c)
	}
}

// slide drops the leading tokens at positions ≤ limit from a never-sealed
// table's residual (its window hides them from every later query), as
// Pool.slide drops whole blocks.
func (r *residual) slide(t *table, limit int32, d int) {
	if r == nil {
		return
	}
	m := 0
	for m < r.n && r.pos[m] <= limit {
		t.freedTo = max(t.freedTo, r.pos[m]+1)
		m++
	}
	if m == 0 {
		return
	}
	r.dropOldest(m, d)
	t.drop += m
	t.dirty = true
}

// put stores token i's key and value.
func (r *residual) put(i, d int, k, v []float32) {
	for c := 0; c < d; c++ {
		r.k[i*d+c] = tensor.F32ToF16(k[c])
		r.v[i*d+c] = tensor.F32ToF16(v[c])
	}
}

// getK and getV decode token i's key or value into out[:d].
func (r *residual) getK(i, d int, out []float32) { halfs(r.k[i*d:(i+1)*d], out) }
func (r *residual) getV(i, d int, out []float32) { halfs(r.v[i*d:(i+1)*d], out) }

func halfs(h []uint16, out []float32) {
	for i, x := range h {
		out[i] = tensor.F16ToF32(x)
	}
}

// move copies token src to slot dst.
func (r *residual) move(dst, src, d int) {
	copy(r.k[dst*d:(dst+1)*d], r.k[src*d:(src+1)*d])
	copy(r.v[dst*d:(dst+1)*d], r.v[src*d:(src+1)*d])
	r.pos[dst] = r.pos[src]
}

// keep keeps the given slots (ascending), in order.
func (r *residual) keep(slots []int, d int) {
	for k, slot := range slots {
		r.move(k, slot, d)
	}
	r.n = len(slots)
}

// push appends a token, growing the buffers if they are full.
func (r *residual) push(d int, pos int32, k, v []float32) {
	if r.n == len(r.pos) {
		r.grow(d, 2*len(r.pos))
	}
	r.put(r.n, d, k, v)
	r.pos[r.n] = pos
	r.n++
}

// grow resizes the buffers to c tokens (c ≥ n).
func (r *residual) grow(d, c int) {
	k, v, pos := make([]uint16, c*d), make([]uint16, c*d), make([]int32, c)
	copy(k, r.k[:r.n*d])
	copy(v, r.v[:r.n*d])
	copy(pos, r.pos[:r.n])
	r.k, r.v, r.pos = k, v, pos
}

// dropOldest forgets the oldest m tokens (sealed or merged elsewhere).
func (r *residual) dropOldest(m, d int) {
	copy(r.k, r.k[m*d:r.n*d])
	copy(r.v, r.v[m*d:r.n*d])
	copy(r.pos, r.pos[m:r.n])
	r.n -= m
}

// len is the tokens held (0 without a residual).
func (r *residual) len() int {
	if r == nil {
		return 0
	}
	return r.n
}

// clone is a copy with buffers of its own (a fork's); nil for nil.
func (r *residual) clone() *residual {
	if r == nil {
		return nil
	}
	return &residual{k: append([]uint16(nil), r.k...), v: append([]uint16(nil), r.v...),
		pos: append([]int32(nil), r.pos...), n: r.n}
}

// segments appends the residual's tokens as attention reads them, if it
// holds any.
func (r *residual) segments(segs []Segment) []Segment {
	if r == nil || r.n == 0 {
		return segs
	}
	return append(segs, Segment{K: u16bytes(r.k), V: u16bytes(r.v), KC: codec.F16, VC: codec.F16, Cap: len(r.pos), N: r.n, Pos: r.pos[:r.n]})
}

func u16bytes(x []uint16) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 2*len(x))
}

// memory adds the bytes of the buffers and of the tokens they hold.
func (r *residual) memory(d int, m *Memory) {
	if r == nil {
		return
	}
	m.Residual += int64(len(r.k)+len(r.v))*2 + int64(len(r.pos))*PosBytes
	m.Used += int64(r.n) * (int64(2*d*2) + PosBytes)
}

// rewriteKey hands token j's key and position to fn and stores what it
// returns (f16, as the residual holds everything).
func (r *residual) rewriteKey(j, d int, key []float32, fn func(pos int32, key []float32) int32) {
	r.getK(j, d, key)
	r.pos[j] = fn(r.pos[j], key)
	for c := 0; c < d; c++ {
		r.k[j*d+c] = tensor.F32ToF16(key[c])
	}
}

// appendResidual adds a token to t's residual (made at the first token)
// and seals what is due unless sealing is held.
func (s *Paged) appendResidual(t *table, pos int32, k, v []float32) error {
	p := s.pool
	d := p.layout.HeadDim
	if t.res == nil {
		t.res = newResidual(p.residualSlots(), d)
	}
	t.res.push(d, pos, k, v)
	if s.hold {
		return nil
	}
	return t.res.sealDue(p, t)
}

// sealDue seals groups while the residual holds residual+sealSize tokens
// (never in a never-sealed table).
// The caller holds p.mu.
func (r *residual) sealDue(p *Pool, t *table) error {
	if t.resWindow > 0 {
		return nil // never sealed
	}
	for r.n >= p.residualSlots() {
		if err := r.seal(p, t, p.sealSize()); err != nil {
			return err
		}
	}
	return nil
}

// seal moves the oldest m residual tokens (whole blocks) into fresh blocks
// of t; keys of a grouped codec are quantized per channel over the m tokens
// together. The caller holds p.mu.
func (r *residual) seal(p *Pool, t *table, m int) error {
	d := p.layout.HeadDim
	if t.n%p.B != 0 {
		return fmt.Errorf("kvcache: sealing into a partly filled block")
	}
	// Decode the m oldest tokens once.
	if cap(r.scratch) < 2*m*d {
		r.scratch = make([]float32, 2*m*d)
	}
	ks, vs := r.scratch[:m*d], r.scratch[m*d:2*m*d]
	for i := 0; i < m; i++ {
		r.getK(i, d, ks[i*d:(i+1)*d])
		r.getV(i, d, vs[i*d:(i+1)*d])
	}
	g, grouped := p.kc.(codec.Grouped)
	if grouped {
		if len(r.lo) != d {
			r.lo, r.hi = make([]float32, d), make([]float32, d)
		}
		groupRange(ks, d, r.lo, r.hi)
	}
	for off := 0; off < m; off += p.B {
		b, err := p.alloc()
		if err != nil {
			return err
		}
		t.blocks = append(t.blocks, b)
		if grouped {
			g.EncodeRange(p.kbuf(b), p.B, d, ks[off*d:(off+p.B)*d], r.lo, r.hi)
		}
		for i := 0; i < p.B; i++ {
			x := (off + i) * d
			if !grouped {
				t.kc.Put(p.kbuf(b), p.B, d, i, ks[x:x+d])
			}
			p.vc.Put(p.vbuf(b), p.B, d, i, vs[x:x+d])
			p.posbuf(b)[i] = r.pos[off+i]
		}
		t.n += p.B
	}
	r.dropOldest(m, d)
	t.dirty = true
	return nil
}

// release seals what is due and gives back the buffer room a held prompt
// took beyond the usual residual. The caller holds p.mu.
func (r *residual) release(p *Pool, t *table) error {
	if err := r.sealDue(p, t); err != nil {
		return err
	}
	r.shrink(p.layout.HeadDim, p.fp.ResidualBuffer(t.resWindow, r.n))
	return nil
}

// groupRange is the per-channel minimum and maximum of x [m][d].
func groupRange(x []float32, d int, lo, hi []float32) {
	copy(lo, x[:d])
	copy(hi, x[:d])
	for i := d; i < len(x); i += d {
		for c := 0; c < d; c++ {
			v := x[i+c]
			if v < lo[c] {
				lo[c] = v
			}
			if v > hi[c] {
				hi[c] = v
			}
		}
	}
}

// HoldSeal, with a KIVI cache, keeps new tokens in the full-precision
// residual instead of sealing them, so a prompt can be compressed before it
// is quantized; releasing it seals what is due. Without KIVI it does
// nothing.
func (s *Paged) HoldSeal(hold bool) error {
	s.hold = hold
	if hold || s.pool.residual == 0 {
		return nil
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range s.tables {
		t := &s.tables[i]
		if t.res != nil {
			if err := t.res.release(p, t); err != nil {
				return err
			}
		}
		t.dirty = true
	}
	return nil
}

// keepSealed compacts a KIVI table whose sealed blocks lose slots: the
// surviving slots of blocks first.. are decoded back into the
// full-precision residual, ahead of its surviving slots, and the residual
// is sealed again group by group. KIVI keys of those slots are thus
// quantized twice (with their new group's range); nothing else is lost.
// The caller holds p.mu.
func (s *Paged) keepSealed(t *table, first int, fromBlocks, fromRes []int) error {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	r := t.res
	n := len(fromBlocks) + len(fromRes)
	nr := newResidual(max(n, len(r.pos)), d)
	kx, vx := make([]float32, d), make([]float32, d)
	for j, slot := range fromBlocks {
		b, i := t.blocks[slot/B], slot%B
		t.kc.Get(p.kbuf(b), B, d, i, kx)
		p.vc.Get(p.vbuf(b), B, d, i, vx)
		nr.put(j, d, kx, vx)
		nr.pos[j] = p.posbuf(b)[i]
	}
	for j, slot := range fromRes {
		o := len(fromBlocks) + j
		copy(nr.k[o*d:(o+1)*d], r.k[slot*d:(slot+1)*d])
		copy(nr.v[o*d:(o+1)*d], r.v[slot*d:(slot+1)*d])
		nr.pos[o] = r.pos[slot]
	}
	for j := len(t.blocks) - 1; j >= first; j-- {
		p.decref(t.blocks[j])
	}
	t.blocks = t.blocks[:first]
	t.n = first * B
	nr.n = n
	t.res = nr
	t.dirty = true
	s.pristine = false
	if s.hold {
		return nil
	}
	return nr.release(p, t)
}
