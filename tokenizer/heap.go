package tokenizer

// The merge loops of both BPE flavours keep their candidate pairs in a
// binary min-heap ordered by before; these restore the heap property.

type ordered[T any] interface{ before(T) bool }

// siftUp moves h[i] up to its place.
func siftUp[T ordered[T]](h []T, i int) {
	x := h[i]
	for i > 0 {
		p := (i - 1) / 2
		if !x.before(h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
}

// siftDown moves h[i] down to its place.
func siftDown[T ordered[T]](h []T, i int) {
	n := len(h)
	x := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1].before(h[c]) {
			c++
		}
		if !h[c].before(x) {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

// popMin removes and returns the smallest element, and the shrunk heap.
func popMin[T ordered[T]](h []T) (T, []T) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	if last > 0 {
		siftDown(h, 0)
	}
	return top, h
}
