//go:build !amd64 || purego

package tensor

// kpKern returns the K-quant kernels for weights of type t (Q4_K, Q6_K):
// the Go twins.
func kpKern(t DType) *kpKernels { return kpGo[t] }
