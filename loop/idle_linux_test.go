package loop

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/panjf2000/gnet/v2"
	"github.com/roost-chat/roost/loop/internal/uring"
	"golang.org/x/sys/unix"
)

// fdConn is a connection of the loop over a real TCP socket, written by
// the loop's own writes (no gnet): Close marks it, as gnet's would before
// OnClose.
type fdConn struct {
	gnet.Conn
	fd     int
	closed bool
}

func (c *fdConn) Fd() int               { return c.fd }
func (c *fdConn) OutboundBuffered() int { return 0 }
func (c *fdConn) Close() error          { c.closed = true; return nil }

// idleRig is a loop with n open connections over loopback TCP, silent for
// an idle interval (due for their ping at the next sweep), and their
// clients' ends.
func idleRig(t *testing.T, n int) (*loopState, []*conn, []*net.TCPConn) {
	t.Helper()
	rig := newFanoutRig(t, 0, false)
	l := rig.l
	needRing(t, l)
	idle := l.srv.cfg.IdleInterval.Milliseconds()
	var cs []*conn
	var peers []*net.TCPConn
	for i := 0; i < n; i++ {
		srv, cli := tcpPair(t)
		var fd int
		withFd(t, srv, func(f int) { fd = f })
		c := &conn{gc: &fdConn{fd: fd}, l: l, state: stateOpen, lastRead: l.now() - idle, pos: int32(len(l.conns))}
		c.linkOut()
		l.conns = append(l.conns, c)
		l.due = append(l.due, c.dueAt())
		cs = append(cs, c)
		peers = append(peers, cli)
	}
	return l, cs, peers
}

// readPing reads the node's ping on a client's end.
func readPing(t *testing.T, p *net.TCPConn) {
	t.Helper()
	_ = p.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [2]byte
	if _, err := p.Read(b[:]); err != nil || b != [2]byte{0x89, 0x00} {
		t.Fatalf("client read % x, %v; want the ping 89 00", b, err)
	}
}

// rcvLowat is the socket's SO_RCVLOWAT.
func rcvLowat(t *testing.T, c *conn) int {
	t.Helper()
	v, err := unix.GetsockoptInt(c.gc.Fd(), unix.SOL_SOCKET, unix.SO_RCVLOWAT)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// readable reports whether the node's socket would wake its loop now.
func readable(t *testing.T, c *conn) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(c.gc.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0 && fds[0].Revents&unix.POLLIN != 0
}

func pongFrame6() []byte { return clientFrame(ws.OpPong, true, nil) }

func TestIsPong(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want bool
	}{
		{pongFrame6(), true},
		{[]byte{0x8A, 0x80, 0, 0, 0, 0}, true},
		{[]byte{0x8A, 0x80, 1, 2, 3}, false},               // cut
		{[]byte{0x8A, 0x80, 1, 2, 3, 4, 5}, false},         // more behind it
		{[]byte{0x8A, 0x81, 1, 2, 3, 4}, false},            // a payload byte follows
		{[]byte{0x89, 0x80, 1, 2, 3, 4}, false},            // a ping
		{[]byte{0x0A, 0x80, 1, 2, 3, 4}, false},            // no FIN
		{[]byte{0x8A, 0x00, 1, 2, 3, 4}, false},            // unmasked
		{clientFrame(ws.OpClose, true, nil), false},        // an empty close, 6 bytes too
		{clientFrame(ws.OpText, true, []byte("x")), false}, // 7 bytes
	} {
		if got := isPong(tc.b); got != tc.want {
			t.Errorf("isPong(% x) = %v, want %v", tc.b, got, tc.want)
		}
	}
}

// A sweep with 64 connections due (its share of pings) sends their pings
// in 128/32 submits, each ping with its hold, not 64 sendto(2): every client gets
// its ping whole, counted as one write of one frame each, and every node
// socket is held (a watermark of 7 bytes).
func TestSweepPingsInBatches(t *testing.T) {
	const n = 64
	l, cs, peers := idleRig(t, n)
	if l.pingShare() < n {
		t.Fatalf("a sweep pings %d, the test wants all %d at once", l.pingShare(), n)
	}
	before := submits(l)
	l.sweep()
	if l.idle.noHold {
		t.Skip("the kernel refuses io_uring's setsockopt (before Linux 6.7)")
	}
	if got, want := submits(l)-before, uint64((2*n+uring.Batch-1)/uring.Batch); got != want {
		t.Fatalf("%d submits for %d pings, want %d", got, n, want)
	}
	for _, p := range peers {
		readPing(t, p)
	}
	st := &l.srv.Stats
	if p, w, f := st.Pings.Load(), st.Writes.Load(), st.FramesOut.Load(); p != n || w != n || f != n {
		t.Fatalf("pings %d, writes %d, frames %d; want %d each", p, w, f, n)
	}
	if h := l.srv.Stats.PongsHeld.Load(); h != n || len(l.idle.held) != n {
		t.Fatalf("%d held (%d listed), want %d", h, len(l.idle.held), n)
	}
	for _, c := range cs {
		if !c.pinged || rcvLowat(t, c) != holdLowat {
			t.Fatalf("conn pinged %v, SO_RCVLOWAT %d; want pinged and %d", c.pinged, rcvLowat(t, c), holdLowat)
		}
	}
}

// The ring's ping results are handled as sendto(2)'s: a full socket
// queues the ping whole behind it, a peer that reset closes the
// connection, and neither is held past the sweep.
func TestRingPingResults(t *testing.T) {
	l, cs, peers := idleRig(t, 3)
	ok, full, gone := cs[0], cs[1], cs[2]
	// Fill full's socket: its client reads nothing.
	_ = peers[1].SetReadBuffer(4096)
	_ = unix.SetsockoptInt(full.gc.Fd(), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	chunk := make([]byte, 4096)
	for i := 0; ; i++ {
		if _, err := unix.Write(full.gc.Fd(), chunk); errors.Is(err, unix.EAGAIN) {
			break
		} else if err != nil || i > 100_000 {
			t.Fatalf("filling: %v after %d writes", err, i)
		}
	}
	_ = peers[2].SetLinger(0)
	_ = peers[2].Close()
	time.Sleep(50 * time.Millisecond) // the reset crosses loopback
	l.sweep()
	readPing(t, peers[0])
	if !ok.pinged || ok.state != stateOpen || ok.m.Out.PendingBytes() != 0 {
		t.Fatalf("answering conn: pinged %v, state %d, pending %d", ok.pinged, ok.state, ok.m.Out.PendingBytes())
	}
	if full.state != stateOpen || full.m.Out.PendingBytes() != len(pingFrame) {
		t.Fatalf("full socket: state %d, %d bytes pending; want open with the ping queued", full.state, full.m.Out.PendingBytes())
	}
	if gone.state != stateClosing || !gone.gc.(*fdConn).closed {
		t.Fatalf("reset peer: state %d, closed %v; want closed", gone.state, gone.gc.(*fdConn).closed)
	}
	if st := &l.srv.Stats; st.FramesOut.Load() != 1 || st.Pings.Load() != 3 {
		t.Fatalf("frames out %d, pings %d; want 1 and 3", st.FramesOut.Load(), st.Pings.Load())
	}
	for _, c := range l.idle.held {
		if c == gone {
			t.Fatal("the closed connection is still held after the sweep")
		}
	}
	if !l.idle.noHold && rcvLowat(t, gone) != 1 {
		t.Fatalf("closed conn's SO_RCVLOWAT %d, want 1 again", rcvLowat(t, gone))
	}
}

// A held socket does not wake the loop for the client's pong; the next
// sweep takes the pong as the connection's input (its next ping an
// interval on) and puts the watermark back. A client that sent more than
// a pong is left to the usual read with every byte still there, one that
// sent nothing stays held and pinged, and a frame of 7 bytes wakes the
// loop at once.
func TestSweepTakesHeldPongs(t *testing.T) {
	l, cs, peers := idleRig(t, 3)
	l.sweep()
	if l.idle.noHold {
		t.Skip("the kernel refuses io_uring's setsockopt (before Linux 6.7)")
	}
	for _, p := range peers {
		readPing(t, p)
	}
	pong, more := pongFrame6(), append(pongFrame6(), clientFrame(ws.OpText, true, []byte(`{"op":"x"}`))...)
	if _, err := peers[0].Write(pong); err != nil {
		t.Fatal(err)
	}
	if _, err := peers[1].Write(more); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if readable(t, cs[0]) {
		t.Fatal("a held socket with a lone pong is readable: it would wake the loop")
	}
	if !readable(t, cs[1]) {
		t.Fatal("a held socket with a pong and a text frame is not readable")
	}
	if readable(t, cs[2]) {
		t.Fatal("a held socket with nothing in it is readable")
	}
	st := &l.srv.Stats
	in := st.FramesIn.Load()
	l.sweep()
	c := cs[0]
	if c.pinged || l.srv.Stats.PongsTaken.Load() != 1 || st.FramesIn.Load() != in+1 {
		t.Fatalf("after the sweep: pinged %v, taken %d, frames in +%d; want the pong taken", c.pinged, l.srv.Stats.PongsTaken.Load(), st.FramesIn.Load()-in)
	}
	if d, want := l.due[c.pos], c.lastRead+l.srv.cfg.IdleInterval.Milliseconds(); d != want {
		t.Fatalf("due %d, want the next ping an interval after the pong, %d", d, want)
	}
	if rcvLowat(t, c) != 1 {
		t.Fatalf("SO_RCVLOWAT %d after the pong was taken, want 1", rcvLowat(t, c))
	}
	var b [16]byte
	if n, _, err := unix.Recvfrom(c.gc.Fd(), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("the pong's socket still holds %d bytes (%v)", n, err)
	}
	// Pong and text: both still in the socket for the read path, the
	// watermark at 1.
	if n, _, err := unix.Recvfrom(cs[1].gc.Fd(), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT); err != nil || n != min(len(more), len(b)) {
		t.Fatalf("pong and text: %d bytes in the socket (%v), want %d", n, err, min(len(more), len(b)))
	}
	if rcvLowat(t, cs[1]) != 1 || !cs[1].pinged {
		t.Fatalf("pong and text: SO_RCVLOWAT %d, pinged %v; want 1, and pinged until the read path reads it", rcvLowat(t, cs[1]), cs[1].pinged)
	}
	// Silent: still held, still pinged, no second ping.
	if !cs[2].pinged || rcvLowat(t, cs[2]) != holdLowat || st.Pings.Load() != 3 {
		t.Fatalf("silent: pinged %v, SO_RCVLOWAT %d, pings %d; want held and pinged once", cs[2].pinged, rcvLowat(t, cs[2]), st.Pings.Load())
	}
	held := false
	for _, h := range l.idle.held {
		held = held || h == cs[2]
	}
	if !held || len(l.idle.held) != 1 {
		t.Fatalf("held list %d long, silent conn in it %v; want it alone", len(l.idle.held), held)
	}
	// A frame with a payload wakes the loop while held.
	if _, err := peers[2].Write(clientFrame(ws.OpText, true, []byte("x"))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if !readable(t, cs[2]) {
		t.Fatal("a 7-byte frame on a held socket does not wake the loop")
	}
}

// Where the kernel refuses the socket command, the loop remembers it: the
// pings still go in batches (the first batch with its refused holds, the
// rest without), nothing is held, and the pong is read as before.
func TestRingHoldRefused(t *testing.T) {
	const n = 40
	l, cs, peers := idleRig(t, n)
	cmd := holdCmd
	holdCmd = 0xFFFF // no such socket command
	t.Cleanup(func() { holdCmd = cmd })
	before := submits(l)
	l.sweep()
	if !l.idle.noHold || l.srv.Stats.PongsHeld.Load() != 0 || len(l.idle.held) != 0 {
		t.Fatalf("noHold %v, %d held; want the refusal remembered and nothing held", l.idle.noHold, l.srv.Stats.PongsHeld.Load())
	}
	if got, want := submits(l)-before, uint64(1+(n-uring.Batch/2+uring.Batch-1)/uring.Batch); got != want {
		t.Fatalf("%d submits, want %d", got, want)
	}
	for i, p := range peers {
		readPing(t, p)
		if rcvLowat(t, cs[i]) > 1 { // a new socket's 0 counts as 1
			t.Fatalf("SO_RCVLOWAT %d on a refused hold, want 1", rcvLowat(t, cs[i]))
		}
	}
	// The next round of pings carries no hold.
	idle := l.srv.cfg.IdleInterval.Milliseconds()
	for i, c := range cs {
		c.pinged, c.lastRead = false, l.now()-idle
		l.due[i] = c.dueAt()
	}
	before = submits(l)
	l.sweep()
	if got, want := submits(l)-before, uint64((n+uring.Batch-1)/uring.Batch); got != want {
		t.Fatalf("second sweep: %d submits, want %d (pings only)", got, want)
	}
	for _, p := range peers {
		readPing(t, p)
	}
	if _, err := peers[0].Write(pongFrame6()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if !readable(t, cs[0]) {
		t.Fatal("without the hold a pong must wake the loop")
	}
}

// Over a real node: a client that answers every ping stays connected
// across several ping periods, each ping an interval (and at most a sweep
// or two) after its last pong, the pongs taken by the sweep; a client
// that never answers is closed on time, twice the interval after its last
// input.
func TestIdlePingsAnsweredKeepConnection(t *testing.T) {
	const iv = 400 * time.Millisecond // the sweep every 100 ms
	n := startNode(t, func(c *Config) { c.Loops = 1; c.IdleInterval = iv })
	answers, silent := n.dial(t, "answers"), n.dial(t, "silent")
	t0 := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		_ = silent.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			h, err := ws.ReadHeader(silent.rd)
			if err != nil {
				closed <- -1
				return
			}
			if _, err := silent.rd.Discard(int(h.Length)); err != nil {
				closed <- -1
				return
			}
			if h.OpCode == ws.OpClose {
				closed <- time.Since(t0)
				return
			}
		}
	}()
	pings := 0
	last := t0
	for time.Since(t0) < 6*iv {
		f := answers.next()
		if f.Op != ws.OpPing {
			t.Fatalf("answering client got opcode %v, want only pings", f.Op)
		}
		gap := time.Since(last)
		// The pong is taken at the next sweep and the ping leaves at the
		// first sweep an interval after that: two sweeps late at most, and
		// timers that slip on a loaded machine.
		if gap < iv-10*time.Millisecond || gap > iv+600*time.Millisecond {
			t.Fatalf("ping %d came %v after the last pong, want an interval (%v) and at most a few sweeps more", pings+1, gap, iv)
		}
		pings++
		if err := wsutil.WriteClientMessage(answers.conn, ws.OpPong, nil); err != nil {
			t.Fatal(err)
		}
		last = time.Now()
	}
	if pings < 4 {
		t.Fatalf("%d pings in %v, want at least 4", pings, 6*iv)
	}
	select {
	case d := <-closed:
		if d < 2*iv-50*time.Millisecond || d > 2*iv+600*time.Millisecond {
			t.Fatalf("the silent client was closed %v after its last input, want twice the interval (%v) and at most a few sweeps more", d, 2*iv)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the silent client was never closed")
	}
	answers.send(`{"op":"join","room":"r"}`)
	answers.expect(map[string]any{"op": "joined", "room": "r"})
	// The counters, not the loop's ring (its goroutine's alone): a pong is
	// held only where a ring sends.
	st := &n.srv.Stats
	if st.PongsTaken.Load() == 0 && st.PongsHeld.Load() > 0 {
		t.Fatal("pongs were held but none was taken by a sweep")
	}
	t.Logf("%d pings answered; %d held, %d pongs taken by the sweep", pings, st.PongsHeld.Load(), st.PongsTaken.Load())
}
