package gguf

import (
	"fmt"
	"math"
	"os"

	"github.com/kvlm/kvlm/tensor"
)

// Open memory-maps the GGUF file at path read-only and parses it: tensors
// are read from the page cache on first use, and processes opening the same
// file share it. Close releases the mapping. For metadata, and where start
// time or memory shared between processes matters more than decode speed.
func Open(path string) (*File, error) { return open(path, mapFile) }

// Load reads the whole GGUF file at path into anonymous memory (transparent
// huge pages advised where the system has them) and parses it; Close frees
// it. Streaming the weights from there, decode ran 4–12% faster than from
// a mapping of the file's 4 KiB page-cache pages on this project's test
// machine (docs/PERFORMANCE.md); llama.cpp as ollama runs it also reads
// rather than maps. Loading costs one read of the file.
func Load(path string) (*File, error) {
	f, err := open(path, readFile)
	if f != nil {
		f.writable = true
	}
	return f, err
}

// open parses the file at path, brought into memory by get.
func open(path string, get func(fh *os.File, size int) ([]byte, func() error, error)) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	size := st.Size()
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gguf: %s: not a regular file", path)
	}
	if size == 0 {
		return nil, fmt.Errorf("gguf: %s: truncated: empty file", path)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("gguf: %s: %d bytes is too large to address", path, size)
	}
	data, unmap, err := get(fh, int(size))
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f, err := parse(data)
	if err != nil {
		err = fmt.Errorf("gguf: %s: %w", path, err)
		if uerr := unmap(); uerr != nil {
			err = fmt.Errorf("%w (and unmap: %v)", err, uerr)
		}
		return nil, err
	}
	f.unmap = unmap
	return f, nil
}

// readFile reads size bytes of fh into tensor.AllocHuge's memory.
func readFile(fh *os.File, size int) ([]byte, func() error, error) {
	data, free, err := tensor.AllocHuge(size)
	if err != nil {
		return nil, nil, err
	}
	if _, err := fh.ReadAt(data, 0); err != nil {
		free()
		return nil, nil, fmt.Errorf("read: %w", err)
	}
	return data, free, nil
}
