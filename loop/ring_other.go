//go:build !linux

package loop

// sendRing is Linux's io_uring (ring_linux.go); elsewhere every write is a
// syscall of its own.
type sendRing struct {
	n       int
	conns   [ringBatch]*conn
	res     [ringBatch]int32
	pending [ringBatch]bool
}

const ringBatch = passCheck

func newSendRing() *sendRing                          { return nil }
func (r *sendRing) close()                            {}
func (r *sendRing) queue(c *conn, fd int, f [][]byte) {}
func (r *sendRing) fits(k int) bool                   { return false }
func (r *sendRing) takes(k int) bool                  { return false }
func (r *sendRing) full() bool                        { return true }
func (r *sendRing) submit() int                       { return 0 }
func (r *sendRing) queued(c *conn) bool               { return false }
