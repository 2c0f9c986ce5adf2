//go:build amd64 && !purego

package tensor

var quantKernA = map[DType]*quantKernels{
	Q8_0:   {rd: 1, rp: 2, tp: 4, dec: qQ8_0Ar1t1, dec1: qQ8_0Ar1t1, pre: qQ8_0Ar2t4, pre1: qQ8_0Ar1t4, rows: qQ8_0Arows},
	Q4_0:   {rd: 1, rp: 2, tp: 4, dec: qQ4_0Ar1t1, dec1: qQ4_0Ar1t1, pre: qQ4_0Ar2t4, pre1: qQ4_0Ar1t4, rows: qQ4_0Arows},
	Q4_K:   {rd: 1, rp: 1, tp: 4, dec: qQ4_KAr1t1, dec1: qQ4_KAr1t1, pre: qQ4_KAr1t4, pre1: qQ4_KAr1t4, rows: qQ4_KArows},
	Q6_K:   {rd: 1, rp: 1, tp: 4, dec: qQ6_KAr1t1, dec1: qQ6_KAr1t1, pre: qQ6_KAr1t4, pre1: qQ6_KAr1t4, rows: qQ6_KArows},
	Q5_K:   {rd: 1, rp: 1, tp: 4, dec: qQ5_KAr1t1, dec1: qQ5_KAr1t1, pre: qQ5_KAr1t4, pre1: qQ5_KAr1t4, rows: qQ5_KArows},
	Q3_K:   {rd: 1, rp: 1, tp: 4, dec: qQ3_KAr1t1, dec1: qQ3_KAr1t1, pre: qQ3_KAr1t4, pre1: qQ3_KAr1t4, rows: qQ3_KArows},
	Q2_K:   {rd: 1, rp: 1, tp: 4, dec: qQ2_KAr1t1, dec1: qQ2_KAr1t1, pre: qQ2_KAr1t4, pre1: qQ2_KAr1t4, rows: qQ2_KArows},
	IQ4_XS: {rd: 1, rp: 1, tp: 4, dec: qIQ4_XSAr1t1, dec1: qIQ4_XSAr1t1, pre: qIQ4_XSAr1t4, pre1: qIQ4_XSAr1t4, rows: qIQ4_XSArows},
	Q4_1:   {rd: 1, rp: 1, tp: 4, dec: qQ4_1Ar1t1, dec1: qQ4_1Ar1t1, pre: qQ4_1Ar1t4, pre1: qQ4_1Ar1t4, rows: qQ4_1Arows},
	Q5_0:   {rd: 1, rp: 1, tp: 4, dec: qQ5_0Ar1t1, dec1: qQ5_0Ar1t1, pre: qQ5_0Ar1t4, pre1: qQ5_0Ar1t4, rows: qQ5_0Arows},
	Q5_1:   {rd: 1, rp: 1, tp: 4, dec: qQ5_1Ar1t1, dec1: qQ5_1Ar1t1, pre: qQ5_1Ar1t4, pre1: qQ5_1Ar1t4, rows: qQ5_1Arows},
	IQ4_NL: {rd: 1, rp: 1, tp: 4, dec: qIQ4_NLAr1t1, dec1: qIQ4_NLAr1t1, pre: qIQ4_NLAr1t4, pre1: qIQ4_NLAr1t4, rows: qIQ4_NLArows},
}

var quantKernV = map[DType]*quantKernels{
	Q8_0:   {rd: 1, rp: 4, tp: 4, dec: qQ8_0Vr1t1, dec1: qQ8_0Vr1t1, pre: qQ8_0Vr4t4, pre1: qQ8_0Vr1t4, rows: qQ8_0Vrows},
	Q4_0:   {rd: 1, rp: 4, tp: 4, dec: qQ4_0Vr1t1, dec1: qQ4_0Vr1t1, pre: qQ4_0Vr4t4, pre1: qQ4_0Vr1t4, rows: qQ4_0Vrows},
	Q4_K:   {rd: 1, rp: 4, tp: 4, dec: qQ4_KVr1t1, dec1: qQ4_KVr1t1, pre: qQ4_KVr4t4, pre1: qQ4_KVr1t4, rows: qQ4_KVrows},
	Q6_K:   {rd: 1, rp: 4, tp: 4, dec: qQ6_KVr1t1, dec1: qQ6_KVr1t1, pre: qQ6_KVr4t4, pre1: qQ6_KVr1t4, rows: qQ6_KVrows},
	Q5_K:   {rd: 1, rp: 4, tp: 4, dec: qQ5_KVr1t1, dec1: qQ5_KVr1t1, pre: qQ5_KVr4t4, pre1: qQ5_KVr1t4, rows: qQ5_KVrows},
	Q3_K:   {rd: 1, rp: 4, tp: 4, dec: qQ3_KVr1t1, dec1: qQ3_KVr1t1, pre: qQ3_KVr4t4, pre1: qQ3_KVr1t4, rows: qQ3_KVrows},
	Q2_K:   {rd: 1, rp: 4, tp: 4, dec: qQ2_KVr1t1, dec1: qQ2_KVr1t1, pre: qQ2_KVr4t4, pre1: qQ2_KVr1t4, rows: qQ2_KVrows},
	IQ4_XS: {rd: 1, rp: 1, tp: 4, dec: qIQ4_XSVr1t1, dec1: qIQ4_XSVr1t1, pre: qIQ4_XSVr1t4, pre1: qIQ4_XSVr1t4, rows: qIQ4_XSVrows},
	Q4_1:   {rd: 1, rp: 1, tp: 4, dec: qQ4_1Vr1t1, dec1: qQ4_1Vr1t1, pre: qQ4_1Vr1t4, pre1: qQ4_1Vr1t4, rows: qQ4_1Vrows},
	Q5_0:   {rd: 1, rp: 1, tp: 4, dec: qQ5_0Vr1t1, dec1: qQ5_0Vr1t1, pre: qQ5_0Vr1t4, pre1: qQ5_0Vr1t4, rows: qQ5_0Vrows},
	Q5_1:   {rd: 1, rp: 1, tp: 4, dec: qQ5_1Vr1t1, dec1: qQ5_1Vr1t1, pre: qQ5_1Vr1t4, pre1: qQ5_1Vr1t4, rows: qQ5_1Vrows},
	IQ4_NL: {rd: 1, rp: 1, tp: 4, dec: qIQ4_NLVr1t1, dec1: qIQ4_NLVr1t1, pre: qIQ4_NLVr1t4, pre1: qIQ4_NLVr1t4, rows: qIQ4_NLVrows},
}

// quantKern returns the integer kernels for weights of type t at the level
// in use (the Go twins at levelGo, and for AVX-512 without VNNI).
func quantKern(t DType) *quantKernels {
	var k *quantKernels
	switch {
	case level == levelAVX512 && cpuVNNI:
		if k = quantKernV[t]; k == nil {
			k = quantKernA[t] // a type with AVX2 kernels only
		}
	case level >= levelAVX2:
		k = quantKernA[t]
	}
	if k == nil { // a type without assembly at this level
		k = quantKernGo[t]
	}
	return k
}

// qpanelV are the AVX-512 VNNI one-token kernels over 16-row panels.
var qpanelV = map[DType]qpanelFunc{Q8_0: qQ8_0Vpanel, Q4_0: qQ4_0Vpanel, Q4_K: qQ4_KVpanel, Q6_K: qQ6_KVpanel}

// qpanelKern returns the one-token panel kernel for weights of type t at
// the level in use, or nil where there is none (quantRows then runs
// qpanelVia over the level's 1×1 kernel). Q4_0's takes the nibbles apart
// with VGF2P8AFFINEQB (GFNI, ~10% faster); CPUs without GFNI get
// qQ4_0VpanelBW, with shifts.
func qpanelKern(t DType) qpanelFunc {
	if level != levelAVX512 || !cpuVNNI {
		return nil
	}
	if t == Q4_0 && !cpuGFNI {
		return qQ4_0VpanelBW
	}
	return qpanelV[t]
}
