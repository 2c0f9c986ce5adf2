package tensor

import (
	"fmt"
	"sync"
)

// MatMulMany computes dsts[i][t] = ws[i]·x[t] for n inputs x [n][Cols] and
// matrices that share them (a layer's Wq, Wk and Wv; W_gate and W_up): the
// same values, bit for bit, as ws[i].MatMul(dsts[i], x, n) for each i, with
// less work. The quantized matrices (Q8_0, Q4_0, Q4_K, Q6_K) quantize x
// once per activation format (Q4_K and Q6_K share one) instead of once per
// matrix, and their products run in one parallel region (two when some go
// through the row-tile kernels of qmm_p8.go (8 or 16 rows) or qmm_kp.go
// (16 rows), which share one of their own); half-float matrices (F16,
// BF16) times one vector share one region of their own, and the other
// float products one more (x packed once for all of them). Every matrix
// must have the same Cols; dsts[i] is [n][ws[i].Rows].
func MatMulMany(dsts [][]float32, ws []*Matrix, x []float32, n int) {
	if len(dsts) != len(ws) {
		panic(fmt.Sprintf("tensor: MatMulMany given %d outputs for %d matrices", len(dsts), len(ws)))
	}
	if len(ws) == 0 {
		return
	}
	cols := ws[0].Cols
	_ = x[n*cols-1]
	mj := multiJobs.Get().(*multiJob)
	defer multiJobs.Put(mj)
	mj.reset()
	for i, w := range ws {
		if w.Cols != cols {
			panic(fmt.Sprintf("tensor: MatMulMany matrices of %d and %d columns", cols, w.Cols))
		}
		_ = dsts[i][n*w.Rows-1]
		switch w.Type {
		case Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS:
			if w.kpApplies(n) {
				// 16-row K-quant kernels: one set of activations for Q4_K
				// and Q6_K (quantizeActsK), tiles in the row-tile region.
				if mj.kpact == nil {
					mj.kpact = getBytes(cols / QK_K * n * xbK)
					quantizeActsK(*mj.kpact, x, cols, n)
				}
				tiles := w.Rows / kpRows
				mj.p8parts = append(mj.p8parts, multiPart{m: w, dst: dsts[i], act: -1, lo: mj.p8tiles, hi: mj.p8tiles + tiles})
				mj.p8tiles += tiles
				continue
			}
			if w.p8Applies(n) {
				// 8- or 16-row kernels: activations quantized once per type
				// (quantizeActsP), tiles in the row-tile region.
				a := -1
				for j, t := range mj.p8types {
					if t == w.Type {
						a = j
					}
				}
				if a < 0 {
					a = len(mj.p8acts)
					ab := getBytes(cols / 32 * n * xbP)
					quantizeActsP(w.Type, *ab, x, cols, n)
					mj.p8types = append(mj.p8types, w.Type)
					mj.p8acts = append(mj.p8acts, ab)
				}
				ks := w.p8Kernels()
				tiles := w.Rows / ks.rows
				mj.p8parts = append(mj.p8parts, multiPart{m: w, p8: ks, dst: dsts[i], act: a, lo: mj.p8tiles, hi: mj.p8tiles + tiles})
				mj.p8tiles += tiles
				continue
			}
			qk := quantKern(w.Type)
			key := actKey(w.Type, qk)
			a := -1
			for j, k := range mj.keys {
				if k == key {
					a = j
				}
			}
			if a < 0 {
				a = len(mj.acts)
				mj.keys = append(mj.keys, key)
				mj.acts = append(mj.acts, quantizeFor(w.Type, qk, x, cols, n))
			}
			u := w.quantUnit()
			tiles := (w.Rows + u - 1) / u
			mj.parts = append(mj.parts, multiPart{m: w, qk: qk, dst: dsts[i], act: a, unit: u, lo: mj.tiles, hi: mj.tiles + tiles})
			mj.tiles += tiles
		case F16, BF16:
			if k := matvecH(w.Type); n == 1 && k != nil {
				// One vector: the rows of every half-float matrix in one
				// parallel region (a layer's matrices lie one after
				// another in the file, so a worker's stream runs on).
				blocks := w.blocks16()
				mj.hparts = append(mj.hparts, multiPart{m: w, hk: k, dst: dsts[i], lo: mj.hblocks, hi: mj.hblocks + blocks})
				mj.hblocks += blocks
				continue
			}
			fallthrough
		case F32: // and half floats times several vectors
			fk := floatKern()
			if fk == nil {
				w.MatMul(dsts[i], x, n)
				continue
			}
			if mj.fk == nil {
				mj.fk = fk
				mj.xp, mj.xbuf = packFor(fk, x, cols, n)
			}
			blocks := w.blocks16()
			mj.fparts = append(mj.fparts, multiPart{m: w, dst: dsts[i], lo: mj.fblocks, hi: mj.fblocks + blocks})
			mj.fblocks += blocks
		default:
			w.MatMul(dsts[i], x, n)
		}
	}
	mj.n = n
	if len(mj.hparts) > 0 {
		mj.x = x
		Parallel(mj.hblocks, halfGrain(cols), mj.runHalf)
	}
	if len(mj.fparts) > 0 {
		// The float matrices' blocks one after another, x packed once.
		Parallel(mj.fblocks, floatGrain(cols, n), mj.runFloat)
	}
	if len(mj.p8parts) > 0 {
		Parallel(mj.p8tiles, 1, mj.runP8)
	}
	if len(mj.parts) > 0 {
		// The matrices' row tiles one after another, as one range of work
		// (the grain in the largest tiles: panels where there are some).
		u := quantRowTile
		for _, p := range mj.parts {
			u = max(u, p.unit)
		}
		Parallel(mj.tiles, quantGrain(cols, n, u), mj.run)
	}
	for i := range mj.acts {
		mj.acts[i].release()
	}
	for _, ab := range mj.p8acts {
		byteBufs.Put(ab)
	}
	if mj.kpact != nil {
		byteBufs.Put(mj.kpact)
	}
	if mj.xbuf != nil {
		floatBufs.Put(mj.xbuf)
	}
	mj.reset()
}

// multiJob is the work of one MatMulMany call (pooled: decode calls it
// several times per layer).
type multiJob struct {
	keys  [][2]int
	acts  []quantActs
	parts []multiPart
	tiles int
	// the matrices of the 8-row kernels (qmm_p8.go): their activations by
	// type, their tiles of 8 rows, n tokens
	p8types []DType
	p8acts  []*[]byte
	p8parts []multiPart
	p8tiles int
	n       int
	// the activations of the 16-row K-quant kernels (qmm_kp.go), whose
	// tiles are p8parts with act -1
	kpact *[]byte
	// half-float matrices times one vector x: their blocks of 16 rows
	// (blocks16) one after another
	hparts  []multiPart
	hblocks int
	x       []float32
	// other float products (F32, half floats times several vectors): the
	// matrices' blocks of panelRows rows one after another, x packed once
	// for fk's kernels (xbuf: the pooled buffer of xp, if any)
	fparts  []multiPart
	fblocks int
	fk      *floatKernels
	xp      []float32
	xbuf    *[]float32
}

// multiPart is one matrix's share [lo, hi) of its region's range: row
// tiles (quantized), rows (hparts) or blocks of panelRows rows (fparts).
type multiPart struct {
	m      *Matrix
	qk     *quantKernels
	p8     p8Set       // the 8- or 16-row kernels (p8parts)
	hk     matvecHFunc // the half-float matrix-vector kernel (hparts)
	dst    []float32
	act    int // index into acts
	unit   int // rows per tile (parts: quantUnit)
	lo, hi int
}

var multiJobs = sync.Pool{New: func() any { return new(multiJob) }}

func (mj *multiJob) reset() {
	clear(mj.acts)
	clear(mj.parts)
	mj.keys, mj.acts, mj.parts, mj.tiles = mj.keys[:0], mj.acts[:0], mj.parts[:0], 0
	clear(mj.p8acts)
	clear(mj.p8parts)
	mj.p8types, mj.p8acts, mj.p8parts, mj.p8tiles = mj.p8types[:0], mj.p8acts[:0], mj.p8parts[:0], 0
	mj.kpact = nil
	clear(mj.hparts)
	mj.hparts, mj.hblocks, mj.x = mj.hparts[:0], 0, nil
	clear(mj.fparts)
	mj.fparts, mj.fblocks, mj.fk, mj.xp, mj.xbuf = mj.fparts[:0], 0, nil, nil, nil
}

// runFloat computes blocks [lo, hi) of the job's range of float blocks.
func (mj *multiJob) runFloat(lo, hi int) {
	for i := range mj.fparts {
		p := &mj.fparts[i]
		if a, b := max(lo, p.lo), min(hi, p.hi); a < b {
			p.m.floatRows(mj.fk, p.dst, mj.xp, mj.n, a-p.lo, b-p.lo)
		}
	}
}

// runHalf computes blocks [lo, hi) of the job's range of half-float
// blocks of 16 rows.
func (mj *multiJob) runHalf(lo, hi int) {
	for i := range mj.hparts {
		p := &mj.hparts[i]
		if a, b := max(lo, p.lo), min(hi, p.hi); a < b {
			p.m.matvecHalfBlocks(p.hk, p.dst, mj.x, a-p.lo, b-p.lo)
		}
	}
}

// runP8 computes the tiles [lo, hi) of the job's range of 8- and 16-row
// tiles (qmm_p8.go) and 16-row K-quant tiles (qmm_kp.go).
func (mj *multiJob) runP8(lo, hi int) {
	for i := range mj.p8parts {
		p := &mj.p8parts[i]
		a, b := max(lo, p.lo), min(hi, p.hi)
		if a >= b {
			continue
		}
		if p.act < 0 {
			p.m.kpTiles(kpKern(p.m.Type), p.dst, *mj.kpact, mj.n, a-p.lo, b-p.lo)
			continue
		}
		p.m.p8Tiles(p.p8, p.dst, *mj.p8acts[p.act], mj.n, a-p.lo, b-p.lo)
	}
}

// run computes tiles [lo, hi) of the job's range.
func (mj *multiJob) run(lo, hi int) {
	for i := range mj.parts {
		p := &mj.parts[i]
		a, b := max(lo, p.lo), min(hi, p.hi)
		if a >= b {
			continue
		}
		p.m.quantRows(p.qk, p.dst, &mj.acts[p.act], (a-p.lo)*p.unit, min((b-p.lo)*p.unit, p.m.Rows))
	}
}
