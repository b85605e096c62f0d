//go:build !linux

package uring

// Ring is Linux's (ring_linux.go): elsewhere New returns nil and every
// write is a syscall of its own. The methods exist so that callers build.
type Ring struct{}

// New returns nil: no io_uring here.
func New(*Stats) *Ring { return nil }

func (r *Ring) Close()                                                 {}
func (r *Ring) Len() int                                               { return 0 }
func (r *Ring) Send(fd int, frames [][]byte) int                       { return 0 }
func (r *Ring) Recv(fd int, buf []byte, flags uint32) int              { return 0 }
func (r *Ring) SocketCmd(op uint32, fd, level, name int, v *int32) int { return 0 }
func (r *Ring) Fits(k int) bool                                        { return false }
func (r *Ring) Takes(k int) bool                                       { return false }
func (r *Ring) Full() bool                                             { return true }
func (r *Ring) Submit() int                                            { return 0 }
func (r *Ring) Result(i int) (res int32, done bool)                    { return 0, false }
