package fanout

import (
	"testing"
	"unsafe"
)

// The node's fixed queues are channels whose buffers are made whole with
// it: posQueue slots of posJob (cycled through by every publish's own
// move, so resident) and 8,192 slots of the rebroadcast queue. Their
// element sizes are each node's heap, whatever its load
// (docs/bench-notes/2026-12-06.md, "rss29").
func TestFixedQueuesSmall(t *testing.T) {
	if n := unsafe.Sizeof(posJob{}); n > 72 {
		t.Errorf("posJob is %d bytes, want <= 72 (%d KiB for the queue): put rare fields behind posJob.ask", n, n*posQueue>>10)
	}
	var n Node
	if e := unsafe.Sizeof(<-n.retries); e != unsafe.Sizeof(uintptr(0)) {
		t.Errorf("the retries channel holds %d-byte values, want pointers", e)
	}
}
