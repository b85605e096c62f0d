//go:build linux

package loop

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/loop/internal/uring"
	"golang.org/x/sys/unix"
)

// TestSendFloor is a probe, not a check: it measures what the kernel takes
// for one frame written to each of many loopback TCP sockets whose peers
// another process reads, the way a pass over a room writes them, so that
// the node's CPU per frame in a pass can be set against the machine's
// floor (docs/bench-notes/2026-12-04.md, "one-channel: where a pass's CPU goes"). It
// runs only when asked:
//
//	ROOST_SENDFLOOR=6000 taskset -c 1 go test -count=1 -run TestSendFloor -v ./loop/
//
// ROOST_SENDFLOOR is the number of sockets; ROOST_SENDFLOOR_CPU the reader's
// CPU (default 0; the writer runs where taskset put the test);
// ROOST_SENDFLOOR_RATE rounds a second (default 5) for 10 s. Each round
// writes one 500-byte frame to every socket, once with the loop's ring (in
// batches of uring.Batch) and once with one send(2) a socket, and the test
// logs the writing thread's user and system CPU per send and the mean
// round.
func TestSendFloor(t *testing.T) {
	if os.Getenv("ROOST_SENDFLOOR_READER") != "" {
		sendFloorReader(t)
		return
	}
	n, _ := strconv.Atoi(os.Getenv("ROOST_SENDFLOOR"))
	if n <= 0 {
		t.Skip("a probe: set ROOST_SENDFLOOR to the number of sockets")
	}
	rate := 5
	if v, _ := strconv.Atoi(os.Getenv("ROOST_SENDFLOOR_RATE")); v > 0 {
		rate = v
	}
	cpu := os.Getenv("ROOST_SENDFLOOR_CPU")
	if cpu == "" {
		cpu = "0"
	}
	for _, viaRing := range []bool{true, false, true, false} {
		sendFloorRound(t, n, rate, cpu, viaRing)
	}
}

// sendFloorRound runs one writer against a fresh reader process.
func sendFloorRound(t *testing.T, n, rate int, cpu string, viaRing bool) {
	reader := exec.Command("taskset", "-c", cpu, os.Args[0], "-test.run=^TestSendFloor$")
	reader.Env = append(os.Environ(), "ROOST_SENDFLOOR_READER=1")
	out, err := reader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Process.Kill(); _ = reader.Wait() }()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr = addr[:len(addr)-1]
	fds := make([]int, 0, n)
	files := make([]*os.File, 0, n)
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).SetNoDelay(true) // as the node's sockets
		f, err := c.(*net.TCPConn).File()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		fds = append(fds, int(f.Fd()))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ring *uring.Ring
	if viaRing {
		if ring = uring.New(new(uring.Stats)); ring == nil {
			t.Skip("no io_uring here")
		}
		defer ring.Close()
	}
	frame := make([]byte, 500)
	frames := [][]byte{frame}
	time.Sleep(time.Second) // the reader's accepts settle
	rounds := 10 * rate
	var before, after syscall.Rusage
	_ = syscall.Getrusage(unix.RUSAGE_THREAD, &before)
	var busy time.Duration
	short := 0
	next := time.Now()
	for r := 0; r < rounds; r++ {
		time.Sleep(time.Until(next))
		next = next.Add(time.Second / time.Duration(rate))
		t0 := time.Now()
		if viaRing {
			for _, fd := range fds {
				ring.Send(fd, frames)
				if ring.Full() {
					short += sendFloorSubmit(ring, len(frame))
				}
			}
			short += sendFloorSubmit(ring, len(frame))
		} else {
			for _, fd := range fds {
				if k, err := unix.SendmsgN(fd, frame, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); err != nil || k != len(frame) {
					short++
				}
			}
		}
		busy += time.Since(t0)
	}
	_ = syscall.Getrusage(unix.RUSAGE_THREAD, &after)
	us := func(a, b syscall.Timeval) float64 {
		return float64(b.Sec-a.Sec)*1e6 + float64(b.Usec-a.Usec)
	}
	sends := float64(rounds * n)
	how := "send(2) a socket"
	if viaRing {
		how = "the ring, " + strconv.Itoa(uring.Batch) + " sends an io_uring_enter"
	}
	t.Logf("%s: %d sends, user %.2f µs, sys %.2f µs per send; a round %v; %d short",
		how, int(sends), us(before.Utime, after.Utime)/sends, us(before.Stime, after.Stime)/sends,
		busy/time.Duration(rounds), short)
}

// sendFloorSubmit sends the ring's batch and counts the sends not taken
// whole.
func sendFloorSubmit(r *uring.Ring, size int) int {
	k := r.Submit()
	short := 0
	for i := 0; i < k; i++ {
		if res, done := r.Result(i); !done || res != int32(size) {
			short++
		}
	}
	return short
}

// sendFloorReader is the reader process: it accepts and reads every
// socket until the writer closes it, one epoll loop, as a bench reads.
func sendFloorReader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString(ln.Addr().String() + "\n")
	ep, err := unix.EpollCreate1(0)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 1<<16)
		evs := make([]unix.EpollEvent, 256)
		for {
			k, err := unix.EpollWait(ep, evs, -1)
			if err != nil {
				continue
			}
			for _, e := range evs[:k] {
				for {
					m, err := unix.Read(int(e.Fd), buf)
					if err == unix.EAGAIN {
						break
					}
					if m <= 0 || err != nil {
						_ = unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, int(e.Fd), nil)
						break
					}
				}
			}
		}
	}()
	// The accepted files stay open (and out of the collector's
	// finalizers) while the reader reads them.
	var keep []*os.File
	defer func() {
		for _, f := range keep {
			f.Close()
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.(*net.TCPConn).File()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, f)
		fd := int(f.Fd())
		_ = unix.SetNonblock(fd, true)
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	}
}
