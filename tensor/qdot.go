package tensor

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// The plain Go twins of the integer kernels (kern_amd64.s): the same
// arithmetic, which the kernels must reproduce bit for bit. A kernel takes
// R weight rows (row r at w + r·ldw) and T tokens (one activation group,
// act.go) over nb blocks and accumulates eight float32 lanes per row and
// token into acc[(t·R+r)·8 + l]; MatMul adds the lanes up with reduceLanes.
//
// For each block the integer part is exact; the float part is, per lane,
// a few products and sums, each rounded to float32, fused where marked:
//
//	Q8_0, Q4_0 (blocks of 32; lane l covers values 4l..4l+3, scale dx[l]):
//	  P = Σ qw·qx;  acc[l] = fma(float32(P)·dx[l], dw, acc[l])  (fused, fma32)
//	Q4_K (blocks of 256; sub-block j = values 32j..32j+31, scale sc_j, min m_j):
//	  I = Σ_j sc_j · Σ_{e=4l..4l+3} q[32j+e]·qx[32j+e]
//	  M = m_l · (bs[2l] + bs[2l+1])
//	  acc[l] += float32(I)·(d·dx) - float32(M)·(dmin·dx)
//	Q6_K (blocks of 256, in eight groups g of 32 values, sixteen scales):
//	  I = Σ_g sc[2g + l/4] · Σ_{e=4l..4l+3} q[32g+e]·qx[32g+e]   (q in 0..63)
//	  M = sc[2l]·bs[2l] + sc[2l+1]·bs[2l+1]
//	  acc[l] += float32(I - 32·M) · (d·dx)

// Single tokens (decode) run the rows kernels (quantmm.go), which for Q8_0
// and Q4_0 put blocks alternately into two sets of lanes, added lane by
// lane before reduceLanes (qrows2Go); the tiles of several tokens use one
// set. Results of one token thus differ in the last bits between the two.

type qkernFunc func(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, acc *float32, load int)

// qkernGo returns the Go twin of the R×T kernel for weights of type t.
func qkernGo(t DType, R, T int) qkernFunc {
	return func(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, acc *float32, load int) {
		bs, xb := actLayout(t)
		bb := t.BlockBytes()
		a := unsafe.Slice(acc, T*R*8)
		if load == 0 {
			clear(a)
		}
		if nb == 0 {
			return
		}
		xs := unsafe.Slice((*byte)(x), nb*T*xb)
		_ = bs
		more := moreDot(t)
		for r := 0; r < R; r++ {
			row := unsafe.Slice((*byte)(unsafe.Add(w, r*ldw)), nb*bb)
			for j := 0; j < T; j++ {
				lanes := (*[8]float32)(a[(j*R+r)*8:])
				for b := 0; b < nb; b++ {
					wb := row[b*bb : (b+1)*bb]
					xblk := xs[(b*T+j)*xb : (b*T+j+1)*xb]
					switch t {
					case Q8_0:
						dotQ8_0(wb, xblk, lanes)
					case Q4_0:
						dotQ4_0(wb, xblk, lanes)
					case Q4_K:
						dotQ4_K(wb, xblk, lanes)
					case Q6_K:
						dotQ6_K(wb, xblk, lanes)
					default:
						more(wb, xblk, lanes)
					}
				}
			}
		}
	}
}

func f32at(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

func dotQ8_0(w, x []byte, acc *[8]float32) {
	dw := F16ToF32(le16(w))
	for l := 0; l < 8; l++ {
		var p int32
		for e := 4 * l; e < 4*l+4; e++ {
			p += int32(int8(w[2+e])) * int32(int8(x[e]))
		}
		acc[l] = fma32(float32(p)*f32at(x[xb32D+4*l:]), dw, acc[l])
	}
}

func dotQ4_0(w, x []byte, acc *[8]float32) {
	dw := F16ToF32(le16(w))
	for l := 0; l < 8; l++ {
		var p int32
		for e := 4 * l; e < 4*l+4; e++ {
			q := w[2+e%16]
			if e >= 16 {
				q >>= 4
			}
			p += (int32(q&0x0f) - 8) * int32(int8(x[e]))
		}
		acc[l] = fma32(float32(p)*f32at(x[xb32D+4*l:]), dw, acc[l])
	}
}

func dotQ4_K(w, x []byte, acc *[8]float32) {
	dx := f32at(x[xbKD:])
	a := F16ToF32(le16(w)) * dx
	bm := F16ToF32(le16(w[2:])) * dx
	scales := (*[12]byte)(w[4:16])
	qs := w[16:144]
	var sc, mn [8]int32
	for j := 0; j < 8; j++ {
		s, m := scaleMinK4(j, scales)
		sc[j], mn[j] = int32(s), int32(m)
	}
	for l := 0; l < 8; l++ {
		var I int32
		for j := 0; j < 8; j++ {
			var p int32
			for e := 4 * l; e < 4*l+4; e++ {
				q := qs[32*(j/2)+e]
				if j%2 == 1 {
					q >>= 4
				}
				p += int32(q&0x0f) * int32(int8(x[32*j+e]))
			}
			I += sc[j] * p
		}
		bs0 := int32(int16(le16(x[xbKBs+4*l:])))
		bs1 := int32(int16(le16(x[xbKBs+4*l+2:])))
		M := mn[l] * (bs0 + bs1)
		acc[l] += float32(float32(float32(I)*a) - float32(float32(M)*bm))
	}
}

func dotQ6_K(w, x []byte, acc *[8]float32) {
	s := F16ToF32(le16(w[208:])) * f32at(x[xbKD:])
	sc := w[192:208]
	for l := 0; l < 8; l++ {
		var I int32
		for g := 0; g < 8; g++ {
			n, i := g/4, g%4 // half, quarter of the half
			var p int32
			for e := 4 * l; e < 4*l+4; e++ {
				ql := w[64*n+32*(i%2)+e]
				if i >= 2 {
					ql >>= 4
				}
				qh := w[128+32*n+e] >> (2 * i) & 3
				q := int32(ql&0x0f | qh<<4)
				p += q * int32(int8(x[32*g+e]))
			}
			I += int32(int8(sc[2*g+l/4])) * p
		}
		bs0 := int32(int16(le16(x[xbKBs+4*l:])))
		bs1 := int32(int16(le16(x[xbKBs+4*l+2:])))
		M := int32(int8(sc[2*l]))*bs0 + int32(int8(sc[2*l+1]))*bs1
		acc[l] += float32(float32(I-32*M) * s)
	}
}

// reduceLanes adds up the eight lanes of an integer kernel's accumulator.
func reduceLanes(a *[8]float32) float32 {
	v0, v1, v2, v3 := a[0]+a[4], a[1]+a[5], a[2]+a[6], a[3]+a[7]
	return (v0 + v2) + (v1 + v3)
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
