//go:build !amd64 || purego

package tensor

func quantKern(t DType) *quantKernels { return quantKernGo[t] }
