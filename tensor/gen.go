package tensor

//go:generate go run asmgen/main.go asmgen/float.go asmgen/quant.go asmgen/quant16.go asmgen/quantpanel.go asmgen/exp.go asmgen/act.go asmgen/kquantp.go asmgen/kquanta.go asmgen/kquantv.go asmgen/q3k.go asmgen/q2k.go asmgen/q32more.go asmgen/attnq.go asmgen/attndot.go
