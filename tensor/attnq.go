package tensor

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Attention over quantized keys and values (the KV cache's q8, q4 and
// KIVI codecs), read where they are stored: a level is decoded as
// s·u + m (a product then a sum, each rounded to float32, as ScaleBytes and
// ScalePanel decode it) in registers, right before the product that uses
// it, instead of a panel or rows decoded to float32 in memory first. The
// results are those of decoding first, bit for bit: the *Go twins below do
// exactly that (ScalePanel, ScaleLevelRows or ScaleLevels, then AttnScores
// or AttnPV), and they run where there is no fused kernel (below AVX-512).

// HalfPairs decodes the 16 {f16 scale, f16 minimum} pairs in meta (64
// bytes, a pair a little-endian uint32 with the scale in its low half: the
// KV codecs' slot metadata) into sm, the scales to sm[0:16] and the
// minimums to sm[16:32], each converted exactly (as F16ToF32).
func HalfPairs(sm *[2 * AttnLanes]float32, meta []byte) {
	_ = meta[4*AttnLanes-1]
	if halfPairsLanes(sm, &meta[0]) {
		return
	}
	halfPairsGo(sm, meta)
}

func halfPairsGo(sm *[2 * AttnLanes]float32, meta []byte) {
	for j := range AttnLanes {
		m := binary.LittleEndian.Uint32(meta[4*j:])
		sm[j], sm[AttnLanes+j] = F16ToF32(uint16(m)), F16ToF32(uint16(m>>16))
	}
}

// AttnScoresQ is AttnScoresOf over a panel of quantized keys: d rows of 16
// levels of bits 8 or 4 in ScalePanel's and ScalePanel4's layout, lane j
// of row c decoded as sm[j]·u + sm[16+j], plus shift[c] when shift is not
// nil. The scores are those of the float32 panel ScalePanel decodes, bit
// for bit. tmp (≥ d·16 values) is scratch for the levels that have no
// fused kernel.
func AttnScoresQ(s []float32, lds int, levels []byte, bits int, sm *[2 * AttnLanes]float32, shift []float32, qp []float32, rows, d int, tmp []float32) {
	if bits != 8 && bits != 4 {
		panic(fmt.Sprintf("tensor: AttnScoresQ over levels of %d bits", bits))
	}
	if rows == 0 || d <= 0 {
		return
	}
	_ = levels[d*AttnLanes*bits/8-1]
	_ = s[(rows-1)*lds+AttnLanes-1]
	_ = qp[rows*d-1]
	var mu *float32
	if shift != nil {
		mu = &shift[:d][0]
	}
	if k := qkQKern(bits, mu != nil); k != nil {
		runQK(k, s, lds, levels, qp, rows, d, &sm[0], mu)
		return
	}
	attnScoresQGo(s, lds, levels, bits, sm, shift, qp, rows, d, tmp)
}

// runQK runs a fused score kernel family (indexed by rows) over the rows
// of qp in groups of attnMR, as attnScores runs the float ones; a and b
// are the kernels' two scale operands.
func runQK(k []qkQFunc, s []float32, lds int, levels []byte, qp []float32, rows, d int, a, b *float32) {
	mr := attnMR()
	for t0 := 0; t0 < rows; t0 += mr {
		g := min(mr, rows-t0)
		k[g](&levels[0], &qp[t0*d], d, &s[t0*lds], 4*lds, a, b)
	}
}

// attnScoresQGo is the twin of the fused score kernels: the panel decoded,
// then scored.
func attnScoresQGo(s []float32, lds int, levels []byte, bits int, sm *[2 * AttnLanes]float32, shift []float32, qp []float32, rows, d int, tmp []float32) {
	tmp = tmp[:d*AttnLanes]
	scalePanel(tmp, levels, sm, shift, d, bits)
	AttnScores(s, lds, tmp, qp, rows, d)
}

// AttnScoresQC is AttnScoresOf over a panel of keys quantized per channel
// (KIVI's keys): d rows of 16 levels of bits 4 or 2 (ScaleLevelRows's
// layout), row c decoded as sc[c]·u + mn[c]. The scores are those of the
// float32 panel ScaleLevelRows decodes, bit for bit. tmp (≥ d·16 values)
// is scratch for the levels that have no fused kernel.
func AttnScoresQC(s []float32, lds int, levels []byte, bits int, sc, mn []float32, qp []float32, rows, d int, tmp []float32) {
	if rows == 0 || d <= 0 {
		return
	}
	_ = levels[d*AttnLanes*bits/8-1]
	_ = s[(rows-1)*lds+AttnLanes-1]
	_ = qp[rows*d-1]
	sc, mn = sc[:d], mn[:d]
	if k := qkCKern(bits); k != nil {
		runQK(k, s, lds, levels, qp, rows, d, &sc[0], &mn[0])
		return
	}
	attnScoresQCGo(s, lds, levels, bits, sc, mn, qp, rows, d, tmp)
}

// attnScoresQCGo is the twin of the fused per-channel score kernels.
func attnScoresQCGo(s []float32, lds int, levels []byte, bits int, sc, mn []float32, qp []float32, rows, d int, tmp []float32) {
	tmp = tmp[:d*AttnLanes]
	ScaleLevelRows(tmp, levels, bits, sc, mn)
	AttnScores(s, lds, tmp, qp, rows, d)
}

// AttnPVQ is AttnPV over n ≤ 16 rows of quantized values: row i, ldv bytes
// after row i−1, holds d levels of bits 8, 4 or 2 (ScaleLevels's packing,
// low bits first), with a scale and minimum per row and 16 columns: value
// c of row i decodes as sm[32k+i]·u + sm[32k+16+i], k = c/16 (len(sm) ≥
// 32·⌈d/16⌉). The result is that of the rows decoded by ScaleLevels and
// summed by AttnPV, bit for bit. tmp (≥ n·d values) is scratch for the
// shapes that have no fused kernel (d not a multiple of 16, or below
// AVX-512).
func AttnPVQ(o []float32, ldo int, p []float32, ldp int, v []byte, bits, ldv int, sm []float32, n, rows, d int, tmp []float32) {
	if rows == 0 || n == 0 || d == 0 {
		return
	}
	if n > AttnLanes {
		panic("tensor: AttnPVQ over more than 16 rows")
	}
	_ = o[(rows-1)*ldo+d-1]
	_ = p[(rows-1)*ldp+n-1]
	_ = v[(n-1)*ldv+(d*bits+7)/8-1]
	_ = sm[2*AttnLanes*((d+15)/16)-1]
	if k := pvQKern(bits); k != nil && d%16 == 0 {
		for r0 := 0; r0 < rows; r0 += 6 {
			g := min(6, rows-r0)
			k[g](&p[r0*ldp], 4*ldp, &v[0], ldv, n, &o[r0*ldo], 4*ldo, d, &sm[0])
		}
		return
	}
	attnPVQGo(o, ldo, p, ldp, v, bits, ldv, sm, n, rows, d, tmp)
}

// attnPVQGo is the twin of the fused weighted-sum kernels: the rows
// decoded 16 columns at a time, then summed.
func attnPVQGo(o []float32, ldo int, p []float32, ldp int, v []byte, bits, ldv int, sm []float32, n, rows, d int, tmp []float32) {
	tmp = tmp[:n*d]
	for i := range n {
		for c0 := 0; c0 < d; c0 += AttnLanes {
			k, c1 := c0/AttnLanes, min(c0+AttnLanes, d)
			row := v[i*ldv+c0*bits/8 : i*ldv+(c1*bits+7)/8]
			ScaleLevels(tmp[i*d+c0:i*d+c1], row, bits, sm[2*AttnLanes*k+i], sm[2*AttnLanes*k+AttnLanes+i])
		}
	}
	AttnPV(o, ldo, p, ldp, unsafe.Slice((*byte)(unsafe.Pointer(&tmp[0])), 4*len(tmp)), F32, 4*d, n, rows, d)
}
