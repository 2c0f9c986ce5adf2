//go:build !amd64 || purego

package tensor

func quantKern(t DType) *quantKernels { return quantKernGo[t] }

// qpanelKern: no panel kernels here (quantRows runs qpanelVia).
func qpanelKern(t DType) qpanelFunc { return nil }
