//go:build !linux

package loop

import "golang.org/x/sys/unix"

// sendRing is Linux's io_uring (ring_linux.go); elsewhere every write is a
// syscall of its own. The fields are those the tests read.
type sendRing struct {
	n       int
	conns   [ringBatch]*conn
	res     [ringBatch]int32
	pending [ringBatch]bool
	submits uint64
	iov     [ringIovs]unix.Iovec
}

const (
	ringBatch = passCheck
	ringIovs  = iovMax
)

func newSendRing() *sendRing                          { return nil }
func (r *sendRing) close()                            {}
func (r *sendRing) queue(c *conn, fd int, f [][]byte) {}
func (r *sendRing) fits(k int) bool                   { return false }
func (r *sendRing) takes(k int) bool                  { return false }
func (r *sendRing) full() bool                        { return true }
func (r *sendRing) submit() int                       { return 0 }
func (r *sendRing) queued(c *conn) bool               { return false }
