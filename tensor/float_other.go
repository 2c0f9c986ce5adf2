//go:build !amd64 || purego

package tensor

import "unsafe"

func floatKern() *floatKernels { return nil }

type matvecHFunc func(w unsafe.Pointer, ldw int, x *float32, n int, rows int, dst *float32)

func matvecH(DType) matvecHFunc { return nil }

type matvecPFunc func(w unsafe.Pointer, x *float32, nb int, dst *float32)

func matvecP(DType) matvecPFunc { return nil }

func dotLanes(a, b []float32, n int) float32 { return dotLanesGo(a[:n], b[:n]) }

func axpyLanes(dst []float32, a float32, x []float32, n int) { axpyGo(dst[:n], a, x[:n]) }

func memRead(p []byte) uint64 { return memReadGo(p) }

func swigluLanes(dst, gate, up []float32) { swigluGo(dst, gate, up) }

func quantActRow(int, []float32, []byte, int, int, int32) bool { return false }

func prefetch(unsafe.Pointer, int, int, int) {}

// Prefetch asks for the bytes of b; a no-op without the assembly kernels.
func Prefetch(b []byte) {}
