//go:build amd64 && !purego

package tensor

// kpV are the AVX-512 VNNI kernels of qmm_kp.go (asmgen/kquantp.go).
var kpV = map[DType]*kpKernels{
	Q4_K: {direct: []kpFunc{qQ4_KVk16t1, qQ4_KVk16t2, qQ4_KVk16t3, qQ4_KVk16t4, qQ4_KVk16t5, qQ4_KVk16t6, qQ4_KVk16t7, qQ4_KVk16t8}},
	Q6_K: {direct: []kpFunc{qQ6_KVk16t1, qQ6_KVk16t2, qQ6_KVk16t3, qQ6_KVk16t4, qQ6_KVk16t5, qQ6_KVk16t6, qQ6_KVk16t7, qQ6_KVk16t8},
		unpack: kpuQ6_K, comp: []kpCompFunc{kpcQ6_Kt1, kpcQ6_Kt2, kpcQ6_Kt3, kpcQ6_Kt4, kpcQ6_Kt5, kpcQ6_Kt6, kpcQ6_Kt7, kpcQ6_Kt8,
			kpcQ6_Kt9, kpcQ6_Kt10, kpcQ6_Kt11, kpcQ6_Kt12, kpcQ6_Kt13, kpcQ6_Kt14, kpcQ6_Kt15, kpcQ6_Kt16}},
}

// kpA are the AVX2 kernels of qmm_kp.go (asmgen/kquanta.go): direct
// kernels for up to 8 tokens, no unpacking ones (kpTiles runs groups of
// up to 8 tokens on the packed rows), no streaming reads: prefetching the
// next tile themselves, they ran 1.3–2× faster than on streamed tiles at
// 2 to 8 tokens (5632×2048 matrices, 2 threads, from the L3 cache or
// from memory).
var kpA = map[DType]*kpKernels{
	Q4_K: {direct: []kpFunc{qQ4_KAk16t1, qQ4_KAk16t2, qQ4_KAk16t3, qQ4_KAk16t4, qQ4_KAk16t5, qQ4_KAk16t6, qQ4_KAk16t7, qQ4_KAk16t8},
		noStream: true},
	Q6_K: {direct: []kpFunc{qQ6_KAk16t1, qQ6_KAk16t2, qQ6_KAk16t3, qQ6_KAk16t4, qQ6_KAk16t5, qQ6_KAk16t6, qQ6_KAk16t7, qQ6_KAk16t8},
		noStream: true},
}

// kpKern returns the K-quant kernels for weights of type t (Q4_K, Q6_K)
// at the level in use: the AVX-512 VNNI kernels at the AVX-512 level on
// machines with VNNI, the AVX2 kernels at the AVX2 level and at the
// AVX-512 level of machines without VNNI, the Go twins at the go level.
// All give the twins' bits, so every level of every machine gives the
// same results.
func kpKern(t DType) *kpKernels {
	switch {
	case level == levelAVX512 && cpuVNNI:
		return kpV[t]
	case level >= levelAVX2:
		return kpA[t]
	}
	return kpGo[t]
}
