//go:build amd64 && !purego

package tensor

import "golang.org/x/sys/cpu"

func init() {
	x := &cpu.X86
	if x.HasAVX2 && x.HasFMA && x.HasF16C {
		cpuLevel = levelAVX2
		if x.HasAVX512F && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL {
			cpuLevel = levelAVX512
			cpuVNNI = x.HasAVX512VNNI
			cpuGFNI = x.HasAVX512GFNI
			cpuVBMI = x.HasAVX512VBMI
		}
	}
	level = cpuLevel
}
