package kvcache

// What the external tests (package kvcache_test, which may import the
// packages above the cache, such as policy for MiniCache's merge) read of
// the cache's internals.

// CheckInvariants, SeqRange and KeyShiftFor are the internal tests'
// helpers.
var (
	CheckInvariants = checkInvariants
	SeqRange        = seqRange
	KeyShiftFor     = testShift
)

// MiniInfo is the MiniCache part of one table.
type MiniInfo struct {
	Pair      int       // the other layer of the merged pair
	Segs      []Segment // merged (with magnitudes) then retained segments
	DirBlocks []int32   // the direction blocks shared with the pair
}

// MiniOf is the MiniCache part of (layer, head); nil if it is not merged.
func MiniOf(s *Paged, layer, head int) *MiniInfo {
	t := s.tab(layer, head)
	if t.mini == nil {
		return nil
	}
	return &MiniInfo{Pair: t.mini.pair, Segs: t.mini.segments(s.pool, t.kc, nil), DirBlocks: t.mini.dir.blocks}
}

// BlockRefs is the reference count of block b.
func BlockRefs(p *Pool, b int32) int32 { return p.meta[b].ref }

// BlockTokensOf is the tokens (layer, head) holds in its ordinary blocks.
func BlockTokensOf(s *Paged, layer, head int) int { return s.tab(layer, head).n }

// ResidualOf is the tokens in the KIVI residual of (layer, head), and
// whether it has one.
func ResidualOf(s *Paged, layer, head int) (int, bool) {
	r := s.tab(layer, head).res
	if r == nil {
		return 0, false
	}
	return r.n, true
}

// RaggedOf is the tokens in each block of (layer, head) when a prune left
// the table ragged, nil when every block but the last is full.
func RaggedOf(s *Paged, layer, head int) []int32 { return s.tab(layer, head).cnt }
