package tensor

import (
	"fmt"
	"strings"
)

// kernelLevel is an instruction-set level of the compute kernels.
type kernelLevel uint8

const (
	levelGo     kernelLevel = iota // plain Go: the reference twins
	levelAVX2                      // AVX2 + FMA + F16C
	levelAVX512                    // AVX-512 F, BW, DQ, VL
)

var levelNames = [...]string{"go", "avx2", "avx512"}

func (l kernelLevel) String() string { return levelNames[l] }

var (
	// cpuLevel is the best level this CPU (and build) supports; cpuVNNI
	// reports AVX-512 VNNI (VPDPBUSD), used by the integer kernels at
	// levelAVX512, cpuGFNI AVX-512 GFNI (VGF2P8AFFINEQB, Q4_0's panel
	// kernel), and cpuVBMI AVX-512 VBMI (VPERMB, VPERMI2B: the dot-product
	// score kernels' level transposes).
	cpuLevel kernelLevel
	cpuVNNI  bool
	cpuGFNI  bool
	cpuVBMI  bool

	// level is the level in use (cpuLevel unless lowered by SetKernels).
	level kernelLevel
)

// Kernels names the kernel set in use: "go", "avx2" or "avx512" (with
// "+vnni" when the integer kernels use VPDPBUSD).
func Kernels() string {
	s := level.String()
	if level == levelAVX512 && cpuVNNI {
		s += "+vnni"
	}
	return s
}

// SetKernels selects the kernel set by name ("go", "avx2", "avx512", or
// "auto" for the best this CPU supports), for comparing kernels against
// their plain Go twins. It is not safe to call while kernels run.
func SetKernels(name string) error {
	name = strings.TrimSuffix(strings.ToLower(name), "+vnni")
	if name == "auto" || name == "" {
		level = cpuLevel
		return nil
	}
	for l, n := range levelNames {
		if n == name {
			if kernelLevel(l) > cpuLevel {
				return fmt.Errorf("tensor: kernels %q are not supported by this CPU or build (best: %s)", name, cpuLevel)
			}
			level = kernelLevel(l)
			return nil
		}
	}
	return fmt.Errorf("tensor: unknown kernel set %q (go, avx2, avx512, auto)", name)
}
