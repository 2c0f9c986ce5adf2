//go:build amd64 && !purego

package tensor

// kpV are the AVX-512 VNNI kernels of qmm_kp.go (asmgen/kquantp.go).
var kpV = map[DType]*kpKernels{
	Q4_K: {direct: []kpFunc{qQ4_KVk16t1, qQ4_KVk16t2, qQ4_KVk16t3, qQ4_KVk16t4, qQ4_KVk16t5, qQ4_KVk16t6, qQ4_KVk16t7, qQ4_KVk16t8}},
	Q6_K: {direct: []kpFunc{qQ6_KVk16t1, qQ6_KVk16t2, qQ6_KVk16t3, qQ6_KVk16t4, qQ6_KVk16t5, qQ6_KVk16t6, qQ6_KVk16t7, qQ6_KVk16t8},
		unpack: kpuQ6_K, comp: []kpCompFunc{kpcQ6_Kt1, kpcQ6_Kt2, kpcQ6_Kt3, kpcQ6_Kt4, kpcQ6_Kt5, kpcQ6_Kt6, kpcQ6_Kt7, kpcQ6_Kt8,
			kpcQ6_Kt9, kpcQ6_Kt10, kpcQ6_Kt11, kpcQ6_Kt12, kpcQ6_Kt13, kpcQ6_Kt14, kpcQ6_Kt15, kpcQ6_Kt16}},
}

// kpKern returns the K-quant kernels for weights of type t (Q4_K, Q6_K)
// at the level in use, or nil where MatMul keeps the 4-row tiles of
// quantmm.go: on machines without AVX-512 VNNI (there is no AVX2 version
// yet). On machines with it, the levels below AVX-512 run the Go twins,
// so that every level gives the same results.
func kpKern(t DType) *kpKernels {
	switch {
	case !cpuVNNI || cpuLevel < levelAVX512:
		return nil
	case level == levelAVX512:
		return kpV[t]
	}
	return kpGo[t]
}
