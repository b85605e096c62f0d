//go:build !linux

package loop

// idleState is the ring's part in an idle node's pings (idle_linux.go);
// elsewhere each ping is a syscall and each pong a read.
type idleState struct{}

func (l *loopState) queuePing(c *conn, fd int) bool { return false }
func (l *loopState) takeHeld(now int64)             {}
func (l *loopState) pingsQueued()                   {}
