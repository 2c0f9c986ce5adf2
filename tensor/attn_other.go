//go:build !amd64 || purego

package tensor

import "unsafe"

type (
	qkFunc func(p unsafe.Pointer, xp *float32, k int, c *float32, ldc int)
	pvFunc func(p *float32, ldp int, v unsafe.Pointer, ldv int, n int, o *float32, ldo int, cols int)
)

func qkKern(DType) []qkFunc { return nil }

func pvKern(DType) []pvFunc { return nil }

func vmaxLanes(s []float32) float32 { return vmaxGo(s) }

func attnExpLanes(s []float32, norm, mx float32) { attnExpGo(s, norm, mx) }

func vdivLanes(s []float32, d float32) { vdivGo(s, d) }

func scaleBytesLanes(dst []float32, u []byte, s, m float32) { scaleBytesGo(dst, u, s, m) }

func scaleLevelsLanes(dst []float32, u []byte, bits int, s, m *float32, per int) {
	n := scaleCount(len(dst), per)
	scaleLevelsGo(dst, u, bits, unsafe.Slice(s, n), unsafe.Slice(m, n), per)
}

func scalePanelLanes(dst []float32, u []byte, sm *[2 * AttnLanes]float32, shift []float32, d, bits int) {
	scalePanelGo(dst, u, sm, shift, d, bits)
}

type (
	qkQFunc func(p *byte, xp *float32, k int, c *float32, ldc int, sm *float32, mu *float32)
	pvQFunc func(p *float32, ldp int, v *byte, ldv int, n int, o *float32, ldo int, cols int, sm *float32)
)

func qkQKern(bits int, shift bool) []qkQFunc { return nil }

func pvQKern(bits int) []pvQFunc { return nil }

func qkCKern(bits int) []qkQFunc { return nil }

type qkDFunc func(p *byte, xp *byte, k int, c *float32, ldc int, sm *float32, cst *float32)

func qkDKern(bits, d int) []qkDFunc { return nil }

type pvDFunc func(p *float32, ldp int, v *byte, ldv int, o *float32, ldo int, cols int, sm *float32, ws *byte)

func pvDKern(bits int) []pvDFunc { return nil }

func halfPairsLanes(sm *[2 * AttnLanes]float32, meta *byte) bool { return false }
