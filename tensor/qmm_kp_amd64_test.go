//go:build amd64 && !purego

package tensor

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestKPKernels: the AVX-512 VNNI K-quant kernels (direct; Q6_K's tile
// unpacked, then multiplied) and the AVX2 ones against their Go twins,
// bit for bit, for every token count, super-block counts from 0, random
// raw blocks (every scale, min and quant) and quantized ones,
// accumulating or not.
func TestKPKernels(t *testing.T) {
	sets := map[string]map[DType]*kpKernels{}
	if cpuLevel >= levelAVX2 {
		sets["avx2"] = kpA
	}
	if cpuVNNI && cpuLevel >= levelAVX512 {
		sets["avx512"] = kpV
	}
	if len(sets) == 0 {
		t.Skip("no AVX2")
	}
	for name, set := range sets {
		t.Run(name, func(t *testing.T) { testKPKernels(t, set) })
	}
}

func testKPKernels(t *testing.T, set map[DType]*kpKernels) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, typ := range []DType{Q4_K, Q6_K} {
		for _, nb := range []int{0, 1, 2, 3, 9} {
			for raw := 0; raw < 2; raw++ {
				var m *Matrix
				if raw == 1 {
					m = randRawMatrix(r, typ, kpRows, max(nb, 1)*QK_K)
				} else {
					m = randMatrix(t, r, typ, kpRows, max(nb, 1)*QK_K)
				}
				ks := set[typ]
				bb := typ.BlockBytes()
				p, err := newPanelMatrix(typ, kpRows, m.Cols, append([]byte(nil), m.Data...))
				if err != nil || p.panels != 1 {
					t.Fatalf("%s panel matrix: %d panels, %v", typ, p.panels, err)
				}
				for k := 0; k < len(ks.direct)+len(ks.comp); k++ {
					T, direct := k+1, k < len(ks.direct)
					if !direct {
						T = k - len(ks.direct) + 1
					}
					n := T + r.IntN(3)
					x := randF32(r, n*m.Cols)
					x[r.IntN(len(x))] = 0
					x[r.IntN(len(x))] *= 1000
					u := make([]byte, max(nb, 1)*kuBytes)
					up := make([]byte, max(nb, 1)*kuBytes)
					if ks.unpack != nil {
						ks.unpack(ptr(m.Data), m.rowBytes, nb, ptr(u), bb)
						ks.unpack(p.rowAt(0), bb, nb, ptr(up), kpRows*bb)
						if !bytes.Equal(u, up) {
							t.Fatalf("%s nb %d: the panel unpacks to other bytes than the rows", typ, nb)
						}
					}
					act := make([]byte, max(nb, 1)*n*xbK)
					quantizeActsK(act, x, m.Cols, n)
					t0 := r.IntN(n - T + 1)
					for load := 0; load < 2; load++ {
						want := randF32(r, kpRows*T)
						got := append([]float32(nil), want...)
						xp := unsafe.Pointer(&act[t0*xbK])
						start := append([]float32(nil), got...)
						kpTwin(typ, T)(ptr(m.Data), m.rowBytes, xp, n*xbK, nb, &want[0], load, bb)
						for panel := 0; panel < 2; panel++ {
							copy(got, start)
							switch {
							case !direct:
								ks.comp[T-1](ptr(u), xp, n*xbK, nb, &got[0], load)
							case panel == 0:
								ks.direct[T-1](ptr(m.Data), m.rowBytes, xp, n*xbK, nb, &got[0], load, bb)
							default:
								ks.direct[T-1](p.rowAt(0), bb, xp, n*xbK, nb, &got[0], load, kpRows*bb)
							}
							for i := range got {
								if !sameBits(got[i], want[i]) {
									t.Fatalf("%s nb %d raw %d T %d direct %v panel %d load %d: acc[%d] = %g, want %g", typ, nb, raw, T, direct, panel, load, i, got[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkKPTile: the K-quant kernels alone (AVX2; AVX-512 VNNI) on a
// 64×2048 panel in L2, one thread, per token count (as BenchmarkQ8P's
// tile8x8); beyond the direct kernels, Q6_K's tiles each unpacked, then
// multiplied once.
func BenchmarkKPTile(b *testing.B) {
	sets := []map[DType]*kpKernels{}
	names := []string{}
	if cpuLevel >= levelAVX2 {
		sets, names = append(sets, kpA), append(names, "avx2")
	}
	if cpuVNNI && cpuLevel >= levelAVX512 {
		sets, names = append(sets, kpV), append(names, "avx512")
	}
	if len(sets) == 0 {
		b.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(3, 4))
	const rows, cols = 64, 2048
	for _, typ := range []DType{Q4_K, Q6_K} {
		m := randRawMatrix(r, typ, rows, cols)
		x := randF32(r, kpMaxT*cols)
		act := make([]byte, cols/QK_K*kpMaxT*xbK)
		quantizeActsK(act, x, cols, kpMaxT)
		u := make([]byte, cols/QK_K*kuBytes)
		var acc [kpMaxT * kpRows]float32
		for si, set := range sets {
			ks := set[typ]
			for _, T := range []int{1, 2, 4, 8, 16} {
				if T > max(len(ks.direct), len(ks.comp)) {
					continue
				}
				b.Run(fmt.Sprintf("%s/%s/T=%d", names[si], typ, T), func(b *testing.B) {
					for b.Loop() {
						for i := 0; i < rows; i += kpRows {
							w := ptr(m.Data[i*m.rowBytes:])
							if T <= len(ks.direct) {
								ks.direct[T-1](w, m.rowBytes, ptr(act), kpMaxT*xbK, cols/QK_K, &acc[0], 0, typ.BlockBytes())
								continue
							}
							ks.unpack(w, m.rowBytes, cols/QK_K, ptr(u), typ.BlockBytes())
							ks.comp[T-1](ptr(u), ptr(act), kpMaxT*xbK, cols/QK_K, &acc[0], 0)
						}
					}
					b.ReportMetric(float64(b.N)*float64(T*rows*cols)/b.Elapsed().Seconds()/1e9, "GMAC/s")
				})
			}
		}
	}
}
