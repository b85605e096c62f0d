package loop

import (
	"syscall"
	"testing"

	"github.com/panjf2000/gnet/v2"

	"github.com/roost-chat/roost/fanout"
)

// bufConn is a socket with gnet's outbound buffer in front, as gnet keeps
// one: Write tries the socket once when the buffer is empty and keeps what
// the kernel refuses; drain hands the buffer to the socket.
type bufConn struct {
	gnet.Conn
	fd  int
	buf []byte
}

func (c *bufConn) Fd() int               { return c.fd }
func (c *bufConn) OutboundBuffered() int { return len(c.buf) }
func (c *bufConn) Write(p []byte) (int, error) {
	if len(c.buf) == 0 {
		n, _ := syscall.Write(c.fd, p)
		p = p[max(n, 0):]
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *bufConn) drain() {
	for len(c.buf) > 0 {
		n, err := syscall.Write(c.fd, c.buf)
		if err != nil || n <= 0 {
			return
		}
		c.buf = c.buf[:copy(c.buf, c.buf[n:])]
	}
}

// parkRig is one member on a non-blocking socketpair with small buffers
// whose peer reads only when told to.
func parkRig(t *testing.T) (*fanoutRig, *bufConn, int) {
	t.Helper()
	rig := newFanoutRig(t, 0, false)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fds[0]); syscall.Close(fds[1]) })
	_ = syscall.SetNonblock(fds[0], true)
	_ = syscall.SetNonblock(fds[1], true)
	_ = syscall.SetsockoptInt(fds[0], syscall.SOL_SOCKET, syscall.SO_SNDBUF, 16<<10)
	gc := &bufConn{fd: fds[0]}
	c := &conn{gc: gc, l: rig.l, state: stateOpen}
	c.linkOut()
	if err := rig.l.table.Join(&c.m, []byte(rig.key), fanout.Resume{}); err != nil {
		t.Fatal(err)
	}
	rig.pump(t, func() bool { return c.m.Rooms() == 1 })
	rig.l.flush()
	drainPeer(fds[1])
	gc.drain()
	rig.l.flush()
	return rig, gc, fds[1]
}

func drainPeer(fd int) {
	buf := make([]byte, 64<<10)
	for {
		if n, _ := syscall.Read(fd, buf); n <= 0 {
			return
		}
	}
}

// A consumer that does not read: what the kernel refuses stays queued in
// the node as references to the shared frames, and gnet holds at most the
// one frame the kernel took part of.
func TestWriteKeepsTheBacklog(t *testing.T) {
	rig, gc, _ := parkRig(t)
	for i := 0; i < 400; i++ {
		rig.deliver(1)
	}
	if gc.OutboundBuffered() > len(rig.frame) {
		t.Fatalf("gnet holds %d bytes, more than one frame (%d)", gc.OutboundBuffered(), len(rig.frame))
	}
	c := rig.l.parked
	if len(c) != 1 || c[0].m.Out.PendingBytes() == 0 {
		t.Fatalf("parked %d connections; the backlog should wait in the node", len(c))
	}
	if got := c[0].m.Out.PendingBytes() + c[0].m.Out.Backlog(); got < 400*len(rig.frame)-64<<10 {
		t.Fatalf("backlog counted %d bytes for 400 frames of %d", got, len(rig.frame))
	}
}

// The parked path allocates nothing in steady state: frames refused, kept,
// written again once gnet drained.
func TestParkedWriteAllocationFree(t *testing.T) {
	rig, gc, peer := parkRig(t)
	buf := make([]byte, 64<<10)
	read := func() {
		for {
			if n, _ := syscall.Read(peer, buf); n <= 0 {
				return
			}
		}
	}
	cycle := func() {
		for i := 0; i < 200; i++ {
			rig.next()
		}
		rig.l.flush() // the kernel takes part: the rest is parked
		rig.l.tick()  // gnet still holds a frame: stays parked
		for len(rig.l.parked) > 0 {
			read()
			gc.drain()
			rig.l.tick() // written again as the peer reads
		}
		read()
		gc.drain()
	}
	cycle()
	cycle()
	if n := leastAllocs(10, cycle); n != 0 {
		t.Fatalf("parked writes allocate %.1f per cycle", n)
	}
}
