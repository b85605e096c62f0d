package loop

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair is a connected loopback pair: the accepted side and the dialled one.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(); _ = d.Close() })
	return a.(*net.TCPConn), d.(*net.TCPConn)
}

// withFd runs f on the socket's descriptor.
func withFd(t testing.TB, c *net.TCPConn, f func(fd int)) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(fd uintptr) { f(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}

// The ping leaves as the whole 2-byte frame, allocation-free; a full socket
// is EAGAIN with nothing written (ping then queues the frame whole), and a
// peer that is gone an error, not a signal.
func TestSendPing(t *testing.T) {
	srv, cli := tcpPair(t)
	withFd(t, srv, func(fd int) {
		n, err := sendPing(fd)
		if n != len(pingFrame) || err != nil {
			t.Fatalf("sendPing = %d, %v; want %d, nil", n, err, len(pingFrame))
		}
		if a := leastAllocs(100, func() { _, _ = sendPing(fd) }); a != 0 {
			t.Fatalf("sendPing allocates %v times", a)
		}
	})
	_ = cli.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got [2]byte
	if _, err := cli.Read(got[:]); err != nil || got != [2]byte{0x89, 0x00} {
		t.Fatalf("peer read % x, %v; want 89 00", got, err)
	}

	// Fill the socket: the peer reads nothing and both buffers are small.
	full, peer := tcpPair(t)
	_ = peer.SetReadBuffer(4096)
	_ = full.SetWriteBuffer(4096)
	withFd(t, full, func(fd int) {
		for i := 0; ; i++ {
			n, err := sendPing(fd)
			if errors.Is(err, unix.EAGAIN) {
				if n != 0 {
					t.Fatalf("full socket: sendPing wrote %d bytes", n)
				}
				return
			}
			if err != nil || n != len(pingFrame) {
				t.Fatalf("ping %d: sendPing = %d, %v", i, n, err)
			}
			if i > 1_000_000 {
				t.Fatal("the socket never filled")
			}
		}
	})

	// A peer that reset: an error back (EPIPE or ECONNRESET), no SIGPIPE.
	gone, rst := tcpPair(t)
	_ = rst.SetLinger(0)
	_ = rst.Close()
	time.Sleep(50 * time.Millisecond) // the reset crosses loopback
	withFd(t, gone, func(fd int) {
		var err error
		for i := 0; i < 3 && err == nil; i++ {
			_, err = sendPing(fd)
		}
		if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("ping to a reset peer: %v; want EPIPE or ECONNRESET", err)
		}
	})
}

// BenchmarkPingSend compares sendto(2), what the sweep pings with, and
// write(2), what it used, for the 2-byte ping on a loopback connection
// whose peer drains in batches. Both pay the same TCP path (over loopback
// the receiver's side too); the difference is the file layer.
func BenchmarkPingSend(b *testing.B) {
	for _, bc := range []struct {
		name string
		send func(fd int) (int, error)
	}{
		{"sendto", sendPing},
		{"write", func(fd int) (int, error) { return unix.Write(fd, pingFrame) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv, cli := tcpPair(b)
			buf := make([]byte, 64<<10)
			withFd(b, srv, func(fd int) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if n, err := bc.send(fd); n != len(pingFrame) || err != nil {
						b.Fatalf("send = %d, %v", n, err)
					}
					if i%256 == 255 {
						b.StopTimer()
						_ = cli.SetReadDeadline(time.Now().Add(5 * time.Second))
						for got := 0; got < 512; {
							n, err := cli.Read(buf)
							if err != nil {
								b.Fatal(err)
							}
							got += n
						}
						b.StartTimer()
					}
				}
			})
		})
	}
}
