package tensor

import (
	"encoding/binary"
	"math"
)

// Activations of a quantized matrix product are quantized to 8 bits on the
// fly, as llama.cpp does, so that the weight blocks are multiplied with
// integer dot products:
//
//   - for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL weights, blocks of 32 (xb32 bytes each): qx[32]
//     int8, corr[8] int32, d[8] float32: a scale for each lane of four
//     values (x[j] ≈ d[j/4]·qx[j]), which costs the kernels nothing over one
//     scale per block (they multiply eight lanes by a vector of scales
//     either way) and makes the quantization error of the activations
//     several times smaller. corr[l] = -c·Σ qx[4l..4l+3], with c = 128 for
//     Q8_0 and 8 for Q4_0: the correction for kernels that offset the
//     weights to unsigned bytes.
//   - for Q4_K, Q6_K, Q5_K, Q3_K, Q2_K and IQ4_XS weights, blocks of 256 (xbK bytes each, ggml's
//     Q8_K): qx[256] int8, bs[16] int16 (bs[k] = Σ qx[16k..16k+15]),
//     d float32 (and padding).
//
// In both, with amax the largest magnitude of the values that share a
// scale, d = amax·(1/127) and qx = round-half-even(x·(127/amax)), within
// ±127.
//
// Tokens are stored in groups: a group of s consecutive tokens (s = 1, or
// the kernels' prefill tile) holds block b of its token j at
// (b·s + j)·blockBytes from the group's start, which is token t0's offset
// t0·nb·blockBytes.
const (
	xb32     = 96
	xb32Corr = 32
	xb32D    = 64
	xbK      = 296
	xbKBs    = 256
	xbKD     = 288
)

// actLayout returns the activation block size (values) and bytes for
// weights of type t.
func actLayout(t DType) (bs, xb int) {
	if t == Q4_K || t == Q6_K || moreKType(t) {
		return QK_K, xbK
	}
	return 32, xb32
}

// actScale returns the scale d = amax·(1/127) of values whose largest
// magnitude is amax, and the inverse scale 127/amax (0 when amax is 0).
func actScale(amax float32) (d, id float32) {
	d = amax * (1.0 / 127)
	if amax != 0 {
		id = 127 / amax
	}
	return d, id
}

// actQuant is round-half-even(v·id) clamped to ±127 (NaN: 0). Adding and
// subtracting 1.5·2^23 rounds a float32 of magnitude ≤ 127 to an integer,
// ties to even.
func actQuant(v, id float32) int8 {
	f := float32(v * id) // no fused multiply-add with what follows
	if !(f >= -127) {
		if f != f {
			return 0
		}
		return -127
	}
	if f > 127 {
		return 127
	}
	return int8(int32(float32(f+12582912) - 12582912))
}

// quantAct32 quantizes 32 values into one xb32 block: each lane of four
// values has its own scale.
func quantAct32(x []float32, dst []byte, corrMul int32) {
	x = x[:32]
	dst = dst[:xb32]
	for l := 0; l < 8; l++ {
		v := (*[4]float32)(x[4*l:])
		d, id := actScale(max(abs32(v[0]), abs32(v[1]), abs32(v[2]), abs32(v[3])))
		q0, q1, q2, q3 := actQuant(v[0], id), actQuant(v[1], id), actQuant(v[2], id), actQuant(v[3], id)
		dst[4*l], dst[4*l+1], dst[4*l+2], dst[4*l+3] = byte(q0), byte(q1), byte(q2), byte(q3)
		s := int32(q0) + int32(q1) + int32(q2) + int32(q3)
		binary.LittleEndian.PutUint32(dst[xb32Corr+4*l:], uint32(-corrMul*s))
		binary.LittleEndian.PutUint32(dst[xb32D+4*l:], math.Float32bits(d))
	}
}

// quantActK quantizes 256 values into one xbK block.
func quantActK(x []float32, dst []byte) {
	x = x[:QK_K]
	dst = dst[:xbK]
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d, id := actScale(amax)
	for k := 0; k < 16; k++ {
		var s int32
		for j := 16 * k; j < 16*k+16; j++ {
			q := actQuant(x[j], id)
			dst[j] = byte(q)
			s += int32(q)
		}
		binary.LittleEndian.PutUint16(dst[xbKBs+2*k:], uint16(int16(s)))
	}
	binary.LittleEndian.PutUint32(dst[xbKD:], math.Float32bits(d))
	clear(dst[xbKD+4 : xbK])
}

// actGroups splits n tokens into groups of tile tokens, the remainder
// in groups of 1; it returns the first token of each group and its size.
func actGroups(n, tile int) [][2]int {
	var g [][2]int
	t := 0
	if tile > 1 {
		for ; t+tile <= n; t += tile {
			g = append(g, [2]int{t, tile})
		}
	}
	for ; t < n; t++ {
		g = append(g, [2]int{t, 1})
	}
	return g
}

// quantizeActs quantizes x [n][cols] for weights of type t into act, in the
// group layout of groups.
func quantizeActs(t DType, act []byte, x []float32, cols int, groups [][2]int) {
	bs, xb := actLayout(t)
	nb := cols / bs
	var corr int32 = 128
	if t == Q4_0 {
		corr = 8
	}
	for _, g := range groups {
		t0, s := g[0], g[1]
		base := act[t0*nb*xb : (t0+s)*nb*xb]
		for j := 0; j < s; j++ {
			row := x[(t0+j)*cols : (t0+j+1)*cols]
			if nb > 0 && quantActRow(bs, row, base[j*xb:], nb, s*xb, corr) {
				continue
			}
			for b := 0; b < nb; b++ {
				blk := base[(b*s+j)*xb : (b*s+j+1)*xb]
				if bs == QK_K {
					quantActK(row[b*bs:], blk)
				} else {
					quantAct32(row[b*bs:], blk, corr)
				}
			}
		}
	}
}
