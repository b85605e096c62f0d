package fanout

// Arena hands out space for small frames built on one goroutine (acks,
// joined, err, pong): frames are carved from a large chunk, so building one
// costs no allocation. A chunk is never reused: frames are immutable and a
// receiver may still reference one; the GC frees a chunk when no frame of
// it is referenced any more.
type Arena struct {
	buf   []byte
	chunk int
}

// NewArena returns an arena with chunks of the given size.
func NewArena(chunk int) *Arena { return &Arena{chunk: chunk} }

// Space returns an empty slice with room for at least n bytes, to append a
// frame into. Follow with Keep.
func (a *Arena) Space(n int) []byte {
	if cap(a.buf)-len(a.buf) < n {
		size := a.chunk
		if n > size {
			size = n
		}
		a.buf = make([]byte, 0, size)
	}
	return a.buf[len(a.buf):len(a.buf)]
}

// Keep claims the frame just appended into the last Space and returns it
// with its capacity capped, so nobody can append into a neighbour. A frame
// that outgrew Space (and so was reallocated by append) is returned as is.
func (a *Arena) Keep(frame []byte) []byte {
	n := len(frame)
	if n == 0 {
		return frame
	}
	tail := a.buf[len(a.buf):cap(a.buf)]
	if len(tail) >= n && &tail[0] == &frame[0] {
		a.buf = a.buf[:len(a.buf)+n]
		return frame[:n:n]
	}
	return frame
}
