package gguf

import (
	"fmt"
	"math"
	"os"
)

// Open memory-maps the GGUF file at path read-only and parses it. Close
// releases the mapping.
func Open(path string) (*File, error) {
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
		return nil, fmt.Errorf("gguf: %s: %d bytes is too large to map", path, size)
	}
	data, unmap, err := mapFile(fh, int(size))
	if err != nil {
		return nil, fmt.Errorf("gguf: map %s: %w", path, err)
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
