//go:build linux

package uring

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newRing(t *testing.T) (*Ring, *Stats) {
	t.Helper()
	st := new(Stats)
	r := New(st)
	if r == nil {
		t.Skip("no io_uring on this kernel")
	}
	t.Cleanup(r.Close)
	return r, st
}

// pair is a connected pair of non-blocking stream sockets.
func pair(t *testing.T) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func readSome(t *testing.T, fd int) []byte {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// A batch of one-frame sends and a sendmsg of several frames leaves in one
// submit, each result the bytes sent, counted in the stats; the iovecs
// hold no frame after the batch, so the frames' memory can be freed.
func TestBatchSendsAndSendmsg(t *testing.T) {
	r, st := newRing(t)
	a1, b1 := pair(t)
	a2, b2 := pair(t)
	one := [][]byte{[]byte("ping")}
	three := [][]byte{[]byte("a"), []byte("bc"), []byte("def")}
	i := r.Send(a1, one)
	j := r.Send(a2, three)
	if i != 0 || j != 1 || r.Len() != 2 {
		t.Fatalf("indexes %d, %d, queued %d; want 0, 1, 2", i, j, r.Len())
	}
	if n := r.Submit(); n != 2 {
		t.Fatalf("submitted %d, want 2", n)
	}
	if res, done := r.Result(i); !done || res != 4 {
		t.Fatalf("send: %d, done %v; want 4", res, done)
	}
	if res, done := r.Result(j); !done || res != 6 {
		t.Fatalf("sendmsg: %d, done %v; want 6", res, done)
	}
	if got := readSome(t, b1); string(got) != "ping" {
		t.Fatalf("peer 1 got %q", got)
	}
	if got := readSome(t, b2); string(got) != "abcdef" {
		t.Fatalf("peer 2 got %q", got)
	}
	for k := range r.iov {
		if r.iov[k].Base != nil {
			t.Fatalf("iovec %d still points at a frame after its batch", k)
		}
	}
	if s, o := st.Submits.Load(), st.Ops.Load(); s != 1 || o != 2 {
		t.Fatalf("stats: %d submits, %d ops; want 1 and 2", s, o)
	}
	if r.Len() != 0 {
		t.Fatalf("%d still queued after Submit", r.Len())
	}
}

// A batch is full at Batch operations or Iovs iovecs; a send of more
// frames than a batch's iovecs is one the ring does not take.
func TestBatchBounds(t *testing.T) {
	r, _ := newRing(t)
	a, b := pair(t)
	frame := [][]byte{[]byte("x")}
	for k := 0; k < Batch; k++ {
		if r.Full() || !r.Fits(1) {
			t.Fatalf("full after %d sends", k)
		}
		r.Send(a, frame)
	}
	if !r.Full() || r.Fits(1) {
		t.Fatal("not full at Batch sends")
	}
	r.Submit()
	if got := readSome(t, b); len(got) != Batch {
		t.Fatalf("peer got %d bytes, want %d", len(got), Batch)
	}
	if r.Takes(Iovs+1) || r.Fits(Iovs+1) || !r.Takes(Iovs) {
		t.Fatal("a send of more frames than a batch's iovecs fits the ring")
	}
}

// A send to a full socket completes at once with EAGAIN: the ring never
// waits in the kernel for a slow consumer's socket to drain.
func TestFullSocketDoesNotWait(t *testing.T) {
	r, _ := newRing(t)
	a, b := pair(t)
	junk := make([]byte, 4096)
	for {
		if n, _ := unix.Write(a, junk); n <= 0 {
			break
		}
	}
	done := make(chan int32, 1)
	go func() {
		r.Send(a, [][]byte{junk[:100]})
		r.Submit()
		res, _ := r.Result(0)
		done <- res
	}()
	select {
	case res := <-done:
		if res != -int32(unix.EAGAIN) {
			t.Fatalf("send to a full socket: %d, want -EAGAIN", res)
		}
	case <-time.After(5 * time.Second):
		unix.Close(b) // let the stuck send finish
		t.Fatal("the ring waited for a full socket")
	}
}

// A peek leaves the bytes in the socket, a recv takes them, and a recv on
// an empty socket completes with EAGAIN rather than waiting.
func TestRecvPeekAndTake(t *testing.T) {
	r, _ := newRing(t)
	a, b := pair(t)
	if _, err := unix.Write(b, []byte("pong!!")); err != nil {
		t.Fatal(err)
	}
	var peek, take, empty [8]byte
	i := r.Recv(a, peek[:], unix.MSG_PEEK)
	j := r.Recv(a, take[:6], 0)
	k := r.Recv(a, empty[:], 0)
	r.Submit()
	if res, _ := r.Result(i); res != 6 || !bytes.Equal(peek[:6], []byte("pong!!")) {
		t.Fatalf("peek: %d %q", res, peek[:])
	}
	if res, _ := r.Result(j); res != 6 || string(take[:6]) != "pong!!" {
		t.Fatalf("recv: %d %q", res, take[:])
	}
	if res, _ := r.Result(k); res != -int32(unix.EAGAIN) {
		t.Fatalf("recv on an empty socket: %d, want -EAGAIN", res)
	}
}

// The setsockopt socket command sets SO_RCVLOWAT where the kernel has it
// (Linux 6.7); a command the kernel does not know fails on its own,
// without failing the batch around it.
func TestSocketCmdSetsockopt(t *testing.T) {
	r, _ := newRing(t)
	a, b := pair(t)
	v := int32(7)
	i := r.SocketCmd(CmdSetsockopt, a, unix.SOL_SOCKET, unix.SO_RCVLOWAT, &v)
	j := r.SocketCmd(0xFFFF, a, unix.SOL_SOCKET, unix.SO_RCVLOWAT, &v)
	k := r.Send(b, [][]byte{[]byte("x")})
	r.Submit()
	if res, _ := r.Result(j); res >= 0 {
		t.Fatalf("unknown socket command: %d, want an error", res)
	}
	if res, _ := r.Result(k); res != 1 {
		t.Fatalf("send beside the failed command: %d, want 1", res)
	}
	res, _ := r.Result(i)
	if res == -int32(unix.EINVAL) || res == -int32(unix.EOPNOTSUPP) {
		t.Skipf("no setsockopt socket command on this kernel (%d)", res)
	}
	if res != 0 {
		t.Fatalf("setsockopt: %d", res)
	}
	if got, err := unix.GetsockoptInt(a, unix.SOL_SOCKET, unix.SO_RCVLOWAT); err != nil || got != 7 {
		t.Fatalf("SO_RCVLOWAT %d (%v), want 7", got, err)
	}
}

// Queueing and submitting a batch allocates nothing.
func TestSubmitAllocationFree(t *testing.T) {
	r, _ := newRing(t)
	a, b := pair(t)
	frames := [][]byte{[]byte("ab"), []byte("cd")}
	buf := make([]byte, 4096)
	round := func() {
		r.Send(a, frames[:1])
		r.Send(a, frames)
		r.Submit()
		_, _ = unix.Read(b, buf)
	}
	round()
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Fatalf("a batch allocates %.1f", n)
	}
}
