package loop

import (
	"bytes"
	"unsafe"

	"github.com/roost-chat/roost/loop/internal/uring"
	"golang.org/x/sys/unix"
)

// iovMax is the kernel's IOV_MAX: a writev of more iovecs fails with EINVAL
// and gnet does not split one, so the write path does.
const iovMax = 1024

// sendRing is the loop's ring, set up at the first socket write (a loop
// of tests' in-memory connections never makes one).
func (l *loopState) sendRing() *uring.Ring {
	if !l.ringTried {
		l.ringTried = true
		if l.srv.cfg.IOURing {
			l.ring = uring.New(&l.srv.Stats.Ring)
		}
	}
	return l.ring
}

// ringQueued reports whether c has an operation in the ring's batch.
func (l *loopState) ringQueued(c *conn) bool {
	for _, q := range l.ringConns[:l.ring.Len()] {
		if q == c {
			return true
		}
	}
	return false
}

// sendQueued submits the ring's batch and finishes each of its writes.
func (l *loopState) sendQueued() {
	r := l.ring
	if r == nil || r.Len() == 0 {
		return
	}
	n := r.Submit()
	for i := 0; i < n; i++ {
		c := l.ringConns[i]
		l.ringConns[i] = nil
		res, done := r.Result(i)
		if !done {
			l.write(c) // not taken by the kernel: sent here instead
			continue
		}
		l.sent(c, res)
	}
}

// sent finishes a write that the ring sent, with its result (bytes sent,
// or -errno) as send(2) or writev(2) would have returned it: what the
// kernel did not take goes to gnet, and the counts are those of write. An
// error other than a full socket is left to write itself, which closes a
// broken connection (and sends on one whose error was the ring's own).
func (l *loopState) sent(c *conn, res int32) {
	m := &c.m.Out
	frames := m.Pending()
	if c.closed || len(frames) == 0 {
		return
	}
	if res < 0 {
		if res != -int32(unix.EAGAIN) && res != -int32(unix.EINTR) {
			l.write(c)
			return
		}
		res = 0
	}
	before := m.PendingBytes()
	done := 0
	rest := int(res)
	for len(frames) > 0 && rest >= len(frames[0]) {
		rest -= len(frames[0])
		frames = frames[1:]
		done++
	}
	if rest > 0 {
		frames[0] = frames[0][rest:]
	}
	l.wrote(c, frames, done, before, false)
}

// write hands c's pending frames to the kernel. Fast path: the transport
// holds nothing from before, so one writev syscall on the socket with the
// loop's iovec array (gnet's Writev goes through x/sys, which allocates
// past 8 slices). Slow path: what the kernel does not take stays queued
// here, as references to the shared frames, except the first frame (or
// what is left of it), which goes into gnet's outbound buffer so that gnet
// watches the socket; once gnet has drained it, the tick writes the rest
// (park). A consumer's backlog thus costs no copy, and what the node still
// holds for it can be dropped (a slow consumer's close) without cutting a
// frame.
func (l *loopState) write(c *conn) { l.writeOut(c, false) }

// writeOut is write; with all, everything the kernel refuses goes into
// gnet at once (a close frame follows it and the connection ends).
func (l *loopState) writeOut(c *conn, all bool) {
	m := &c.m.Out
	frames := m.Pending()
	if len(frames) == 0 {
		return
	}
	gc := c.gc
	fd := gc.Fd()
	if fd < 0 {
		all = true // a transport without a socket (tests' in-memory conn) takes everything
	}
	if gc.OutboundBuffered() > 0 && !all {
		l.park(c)
		return
	}
	before := m.PendingBytes()
	done := 0 // frames handed to the kernel or to gnet
	if gc.OutboundBuffered() == 0 && fd >= 0 {
		for len(frames) > 0 {
			n := min(len(frames), iovMax)
			total := 0
			var w uintptr
			var errno unix.Errno
			if n == 1 {
				// One frame, the common case when each connection gets a
				// frame every few hundred ms: send(2) goes to the socket
				// directly, without writev's iovec copy-in and the file
				// layer in front of the socket.
				total = len(frames[0])
				w, _, errno = unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&frames[0][0])), uintptr(total), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
			} else {
				for i := 0; i < n; i++ {
					l.iov[i].Base = &frames[i][0]
					l.iov[i].SetLen(len(frames[i]))
					total += len(frames[i])
				}
				w, _, errno = unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&l.iov[0])), uintptr(n))
				for i := 0; i < n; i++ {
					l.iov[i].Base = nil // do not pin frame chunks
				}
			}
			if errno != 0 {
				if errno != unix.EAGAIN && errno != unix.EINTR {
					l.q.Flushed(m)
					c.fail()
					return
				}
				w = 0
			}
			if int(w) == total {
				frames = frames[n:]
				done += n
				continue
			}
			rest := int(w)
			for rest >= len(frames[0]) {
				rest -= len(frames[0])
				frames = frames[1:]
				done++
			}
			frames[0] = frames[0][rest:]
			break
		}
	}
	l.wrote(c, frames, done, before, all)
}

// wrote is the rest of a write once the kernel had its go: frames are what
// it did not take (the first one possibly cut), done how many frames it
// took whole; what is left goes to gnet (all) or its first frame does and
// the connection is parked, and the counts follow.
func (l *loopState) wrote(c *conn, frames [][]byte, done, before int, all bool) {
	m := &c.m.Out
	gc := c.gc
	if len(frames) > 0 {
		// The socket is full (or was). The first Write may try it once
		// more; the rest append.
		keep := 1
		if all {
			keep = len(frames)
		} else if c.m.SSE() {
			// An event and its id line go together: a stream cut after
			// the event but before its id (a slow consumer's close drops
			// what is still queued here) would dispatch the event without
			// its position, and the client's resume would send it again.
			for keep < len(frames) && !bytes.HasSuffix(frames[keep-1], sseEnd) {
				keep++
			}
		}
		for _, f := range frames[:keep] {
			if c.closed {
				break
			}
			_, _ = gc.Write(f)
		}
		done += keep
	}
	l.wFrames += done
	l.wCount++
	st := &l.srv.Stats
	st.FramesOut.Add(uint64(done))
	st.Writes.Add(1)
	st.WriteFrames.Observe(float64(done))
	l.q.Sent(m, done)
	st.BytesOut.Add(uint64(before - m.PendingBytes()))
	if c.closed {
		return
	}
	m.SetBacklog(gc.OutboundBuffered())
	if m.PendingBytes() > 0 {
		l.park(c)
	}
}
