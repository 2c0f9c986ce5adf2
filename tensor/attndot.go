package tensor

import (
	"fmt"
	"math"
)

// Scores of quantized keys by integer dot products (the KV cache's q8dot
// and q4dot key codecs): each query row is rounded to int8 once, with one
// scale per row, and a panel of 16 keys' 8- or 4-bit levels is scored by
// 32-bit integer sums of level × query products (AVX-512 VNNI's VPDPBUSD,
// 64 products an instruction), each slot's scale and minimum applied once
// per score instead of once per level. This is what llama.cpp does with a
// q8_0 K cache. It is not the decoded path's arithmetic: the score is that
// of the rounded query q̂ (q̂_c = a·i_c, |q_c − q̂_c| ≤ a/2, a = max|q|/127)
// against the decoded keys, exact but for float32's rounding of the
// epilogue; AttnScoresQ scores the query itself.

// DotMR is the number of query rows PackQueriesDot groups together (the
// kernels' accumulators).
const DotMR = 12

// DotMaxHead is the largest head size AttnScoresDot takes: its int32 sums
// stay below 2²⁴, exact in float32.
const DotMaxHead = 512

// PackQueriesDot rounds the query rows q [rows][d] (d a multiple of 4) to
// int8 for AttnScoresDot: qd (len ≥ rows·d) receives them in groups of
// DotMR rows (the last group the rest), each group stored [d/4][g][4] (four
// channels of a row together); cst (len ≥ 3·rows) receives per row r its
// scale a = max|q_r|/127 (cst[3r]) and b = a·Σ_c i_c (cst[3r+1]); cst[3r+2]
// is set by DotShifts. A row of zeros has scale 0.
func PackQueriesDot(qd []byte, cst []float32, q []float32, rows, d int) {
	if d%4 != 0 {
		panic(fmt.Sprintf("tensor: PackQueriesDot over rows of %d values (want a multiple of 4)", d))
	}
	_ = qd[rows*d-1]
	_ = cst[3*rows-1]
	_ = q[rows*d-1]
	for r := range rows {
		x := q[r*d : (r+1)*d]
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		g0 := r / DotMR * DotMR
		g := min(DotMR, rows-g0)
		base := g0*d + 4*(r-g0)
		var inv float32 // a row of zeros rounds to zeros
		if amax != 0 {
			inv = 127 / amax
		}
		var sum int32
		for c, v := range x {
			i := int32(math.Round(float64(v * inv)))
			i = max(-127, min(127, i))
			qd[base+c/4*4*g+c%4] = byte(int8(i))
			sum += i
		}
		a := amax / 127
		cst[3*r], cst[3*r+1] = a, a*float32(sum)
	}
}

// DotShifts sets cst[3r+2] to q_r·shift (summed in c order, a product then
// a sum), the part of row r's scores that a key shift adds (0 for a nil
// shift): AttnScoresDot adds it to every score of the row.
func DotShifts(cst []float32, q []float32, shift []float32, rows, d int) {
	_ = cst[3*rows-1]
	for r := range rows {
		var s float32
		if shift != nil {
			x, mu := q[r*d:(r+1)*d], shift[:d]
			for c := range d {
				s += float32(x[c] * mu[c])
			}
		}
		cst[3*r+2] = s
	}
}

// AttnScoresDot sets s[r·lds + j], for the rows r < rows of qd and cst
// (from PackQueriesDot and DotShifts) and the 16 keys j of a panel of d rows
// of 16 levels of bits 8 or 4 (AttnScoresQ's layout, lane j of row c
// decoded as sm[j]·u + sm[16+j]), to
//
//	((float32(Σ_c u_jc·i_rc) · sm[j]) · a_r) + sm[16+j]·b_r + cst[3r+2]
//
// each product and sum rounded to float32 in that order: the rounded query
// against the decoded keys (plus the shift's part). The integer sum is
// exact (|Σ| < 2²⁴ for d ≤ 512).
func AttnScoresDot(s []float32, lds int, levels []byte, bits int, sm *[2 * AttnLanes]float32, qd []byte, cst []float32, rows, d int) {
	if bits != 8 && bits != 4 {
		panic(fmt.Sprintf("tensor: AttnScoresDot over levels of %d bits", bits))
	}
	if d%4 != 0 || d > DotMaxHead {
		panic(fmt.Sprintf("tensor: AttnScoresDot over rows of %d values (want a multiple of 4, at most %d)", d, DotMaxHead))
	}
	if rows == 0 || d == 0 {
		return
	}
	_ = levels[d*AttnLanes*bits/8-1]
	_ = s[(rows-1)*lds+AttnLanes-1]
	_ = qd[rows*d-1]
	_ = cst[3*rows-1]
	k := qkDKern(bits, d)
	for g0 := 0; g0 < rows; g0 += DotMR {
		g := min(DotMR, rows-g0)
		if k == nil {
			attnScoresDotGo(s[g0*lds:], lds, levels, bits, sm, qd[g0*d:], cst[3*g0:], g, d)
			continue
		}
		k[g](&levels[0], &qd[g0*d], d, &s[g0*lds], 4*lds, &sm[0], &cst[3*g0])
	}
}

// attnScoresDotGo is the twin of the dot-product score kernels, over one
// group of g rows.
func attnScoresDotGo(s []float32, lds int, levels []byte, bits int, sm *[2 * AttnLanes]float32, qd []byte, cst []float32, g, d int) {
	for r := range g {
		a, b, c := cst[3*r], cst[3*r+1], cst[3*r+2]
		for j := range AttnLanes {
			var acc int32
			for ch := range d {
				u := packedLevel(levels, bits, ch*AttnLanes+j)
				acc += int32(u) * int32(int8(qd[ch/4*4*g+4*r+ch%4]))
			}
			t := float32(float32(acc) * sm[j])
			t = float32(t * a)
			u := float32(sm[AttnLanes+j] * b)
			t = float32(t + u)
			s[r*lds+j] = float32(t + c)
		}
	}
}

// DotScratch is the bytes AttnPVDot needs for its ws argument.
const DotScratch = DotMR * (AttnLanes + 8)

// AttnPVDot is AttnPVQ over 16 rows of 8- or 4-bit value levels (q8dot,
// q4dot values; 4 bits: channel 2j in the low nibble of byte j) by
// integer dot products: each weight row p_r is rounded to int8 against
// the slots' scales (w_i = p_ri·sm[i], W = max(max_i w_i, FLT_MIN), levels
// round(w_i·(127/W)), scale a = W/127) and the levels' products summed in
// int32, so that
//
//	o[r][c] += float32(Σ_i u_ic·l_ri)·a + mm,  mm = Σ_i p_ri·sm[16+i]
//
// (mm summed as a tree: lanes i and i+8, then +4, +2, +1; each product
// and sum rounded to float32). Row i of the values, ldv bytes after row
// i−1, holds d levels (d a multiple of 16); slot i decodes as
// sm[i]·u + sm[16+i], the same for every channel (one scale a slot: q8's
// and q4's per-token groups). The error against the decoded values'
// weighted sum is at most a/2·Σ_i u_ic a column, but for float32's
// rounding. ws is scratch of DotScratch bytes.
func AttnPVDot(o []float32, ldo int, p []float32, ldp int, v []byte, bits, ldv int, sm *[2 * AttnLanes]float32, rows, d int, ws []byte) {
	if bits != 8 && bits != 4 {
		panic(fmt.Sprintf("tensor: AttnPVDot over levels of %d bits", bits))
	}
	if d%AttnLanes != 0 {
		panic(fmt.Sprintf("tensor: AttnPVDot over rows of %d values (want a multiple of 16)", d))
	}
	if rows == 0 || d == 0 {
		return
	}
	_ = o[(rows-1)*ldo+d-1]
	_ = p[(rows-1)*ldp+AttnLanes-1]
	_ = v[(AttnLanes-1)*ldv+d*bits/8-1]
	_ = ws[DotScratch-1]
	k := pvDKern(bits)
	for g0 := 0; g0 < rows; g0 += DotMR {
		g := min(DotMR, rows-g0)
		if k == nil {
			attnPVDotGo(o[g0*ldo:], ldo, p[g0*ldp:], ldp, v, bits, ldv, sm, g, d)
			continue
		}
		k[g](&p[g0*ldp], 4*ldp, &v[0], ldv, &o[g0*ldo], 4*ldo, d, &sm[0], &ws[0])
	}
}

// attnPVDotGo is the twin of the dot-product weighted-sum kernels.
func attnPVDotGo(o []float32, ldo int, p []float32, ldp int, v []byte, bits, ldv int, sm *[2 * AttnLanes]float32, rows, d int) {
	const L = AttnLanes
	var l [L]int32
	for r := range rows {
		var w, t [L]float32
		wmax := float32(0)
		for i := range L {
			w[i] = float32(p[r*ldp+i] * sm[i])
			t[i] = float32(p[r*ldp+i] * sm[L+i])
			wmax = max(wmax, w[i])
		}
		wmax = max(wmax, 0x1p-126) // FLT_MIN
		inv, a := 127/wmax, wmax/127
		for i := range L {
			l[i] = int32(math.RoundToEven(float64(float32(w[i] * inv))))
		}
		for h := L / 2; h >= 1; h /= 2 { // the tree: i and i+h
			for i := range h {
				t[i] = float32(t[i] + t[i+h])
			}
		}
		mm := t[0]
		for c := range d {
			var acc int32
			for i := range L {
				acc += int32(packedLevel(v[i*ldv:], bits, c)) * l[i]
			}
			x := float32(float32(acc) * a)
			x = float32(x + mm)
			o[r*ldo+c] = float32(o[r*ldo+c] + x)
		}
	}
}
