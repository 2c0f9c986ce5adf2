//go:build unix

package gguf

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps size bytes of fh read-only.
func mapFile(fh *os.File, size int) ([]byte, func() error, error) {
	data, err := unix.Mmap(int(fh.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("map: %w", err)
	}
	return data, func() error { return unix.Munmap(data) }, nil
}
