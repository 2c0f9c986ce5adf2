//go:build unix

package tensor

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// AllocHuge returns n zeroed bytes of private anonymous memory advised for
// transparent huge pages, and the function that frees them. Weights are
// read into such memory (gguf.Load): streamed from 2 MiB pages, decode ran
// 4–12% faster than from 4 KiB ones here; the bandwidth measurement reads
// the same kind of memory. Where huge pages are off, or the advice fails,
// the memory keeps small pages: only speed differs.
func AllocHuge(n int) ([]byte, func() error, error) {
	if n <= 0 {
		return nil, func() error { return nil }, nil
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, nil, fmt.Errorf("allocate %d bytes: %w", n, err)
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return b, func() error { return unix.Munmap(b) }, nil
}
