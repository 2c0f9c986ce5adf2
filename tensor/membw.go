package tensor

import (
	"encoding/binary"
	"time"
)

// MemRead reads every byte of p and returns their XOR folded to 64 bits
// (so that the reads cannot be optimised away): a streaming read, for
// measuring the memory bandwidth that bounds decode speed.
func MemRead(p []byte) uint64 {
	n := len(p) &^ 255
	var x uint64
	if n > 0 {
		x = memRead(p[:n])
	}
	for i := n; i+8 <= len(p); i += 8 {
		x ^= binary.LittleEndian.Uint64(p[i:])
	}
	for i := len(p) &^ 7; i < len(p); i++ {
		x ^= uint64(p[i])
	}
	return x
}

func memReadGo(p []byte) uint64 {
	var a, b, c, d uint64
	for i := 0; i+32 <= len(p); i += 32 {
		a ^= binary.LittleEndian.Uint64(p[i:])
		b ^= binary.LittleEndian.Uint64(p[i+8:])
		c ^= binary.LittleEndian.Uint64(p[i+16:])
		d ^= binary.LittleEndian.Uint64(p[i+24:])
	}
	return a ^ b ^ c ^ d
}

// MeasureBandwidth returns the read bandwidth in bytes per second of
// `threads` workers each streaming its share of buf (which should be much
// larger than the caches), best of reps passes.
func MeasureBandwidth(buf []byte, threads, reps int) float64 {
	threads = max(1, threads)
	chunk := len(buf) / threads &^ 255
	best := 0.0
	for r := 0; r < max(1, reps); r++ {
		done := make(chan struct{}, threads)
		t0 := time.Now()
		for w := 0; w < threads; w++ {
			go func(p []byte) {
				MemRead(p)
				done <- struct{}{}
			}(buf[w*chunk : (w+1)*chunk])
		}
		for w := 0; w < threads; w++ {
			<-done
		}
		if bw := float64(threads*chunk) / time.Since(t0).Seconds(); bw > best {
			best = bw
		}
	}
	return best
}
