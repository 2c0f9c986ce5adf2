//go:build !unix

package gguf

import "os"

// mapFile reads the file into memory where mmap is not available.
func mapFile(fh *os.File, size int) ([]byte, func() error, error) { return readFile(fh, size) }
