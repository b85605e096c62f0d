//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"container/heap"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The waitLoop backend: one OS thread reads every connection (epoll),
// stamps each request with the kernel's receive time of its last bytes
// (SO_TIMESTAMPNS) and writes its answer when that time plus the delay
// comes, from a heap of deadlines and one timerfd.
//
// Why not a goroutine per connection, as the other modes: there the
// delay counted from when the goroutine got round to reading the
// request, and the answer left when a goroutine (or the answer thread)
// was next scheduled; on two cores shared with the node and the load,
// either end could be a millisecond or more off, and the first end was
// not even seen in the backend's own figures. Counting from the kernel's
// receive time makes a late read cost nothing; one thread that sleeps
// in the kernel until the next slice leaves only its own wake-up between
// a deadline and its write.

// defaultSlice is --slice: deadlines are rounded up to it, so that the
// answers of a burst (its calls read within microseconds) leave in one
// wake-up; an answer is never early and at most a slice late from it.
const defaultSlice = 20 * time.Microsecond

// defaultLead is --lead. Spinning brought the answers closer to their
// deadline (a timerfd wake-up alone ended p50 86–126 µs past it, with
// 100 µs spun 18–74 µs) but cost the backend 17–20% more CPU per call in
// hooked runs, taken from the cores it shares with the node and the bench
// (and three of five hooked runs with it fell behind, none without): so
// the thread sleeps to the slice unless asked.
const defaultLead = 0

// loopConn is one connection of the loop.
type loopConn struct {
	fd      int
	in      []byte
	stamp   int64 // kernel receive time (Unix ns) of the last bytes read
	pending bool  // an answer is due: the next request waits for it (no pipelining)
	out     []byte
	close   bool // close once out is written (400, Connection: close)
}

// loopAnswer is one call's answer, due at deadline (Unix ns).
type loopAnswer struct {
	c        *loopConn
	b        []byte
	read     int64
	deadline int64
	timed    bool
}

type loopAnswers []*loopAnswer

func (h loopAnswers) Len() int           { return len(h) }
func (h loopAnswers) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h loopAnswers) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *loopAnswers) Push(x any)        { *h = append(*h, x.(*loopAnswer)) }
func (h *loopAnswers) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return a
}

// netLoop is the thread's state; mu guards only what accept hands it.
type netLoop struct {
	ps    *proxyServer
	ep    int
	efd   int // new connections, stop
	tfd   int // the next slice with an answer due
	slice int64
	lead  int64 // wake this long before a slice and spin the rest (0: sleep to it)

	mu     sync.Mutex
	added  []int
	stopIt bool

	conns map[int]*loopConn
	due   loopAnswers
	armed int64 // the timerfd's expiry (0: disarmed)
	rx    rx
	buf   []byte
	br    *bufio.Reader
	gone  chan struct{}
}

func newNetLoop(ps *proxyServer) (*netLoop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_REALTIME, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		unix.Close(efd)
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	for _, fd := range []int{efd, tfd} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			unix.Close(ep)
			unix.Close(efd)
			unix.Close(tfd)
			return nil, err
		}
	}
	slice := ps.cfg.slice
	if slice <= 0 {
		slice = 1
	}
	l := &netLoop{ps: ps, ep: ep, efd: efd, tfd: tfd, slice: int64(slice), lead: max(ps.cfg.lead.Nanoseconds(), 0), conns: map[int]*loopConn{},
		buf: make([]byte, 64<<10), br: bufio.NewReaderSize(nil, 4<<10), gone: make(chan struct{})}
	go l.run()
	return l, nil
}

// adopt takes nc over: its descriptor is duplicated into the loop and nc
// closed, so that Go's poller no longer reads it.
func (l *netLoop) adopt(nc net.Conn) {
	defer nc.Close()
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.SetNoDelay(true)
	f, err := tc.File()
	if err != nil {
		return
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return
	}
	unix.CloseOnExec(fd)
	if unix.SetNonblock(fd, true) != nil || unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) != nil {
		unix.Close(fd)
		return
	}
	l.mu.Lock()
	if l.stopIt {
		l.mu.Unlock()
		unix.Close(fd)
		return
	}
	l.added = append(l.added, fd)
	_, _ = unix.Write(l.efd, one[:])
	l.mu.Unlock()
}

func (l *netLoop) close() {
	l.mu.Lock()
	l.stopIt = true
	_, _ = unix.Write(l.efd, one[:])
	l.mu.Unlock()
	<-l.gone
}

func (l *netLoop) run() {
	runtime.LockOSThread()
	defer close(l.gone)
	// The kernel may end a sleep up to the timer slack (50 µs) late to
	// batch wake-ups; this thread's sleeps are its answers' timing.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	events := make([]unix.EpollEvent, 128)
	var b8 [8]byte
	for {
		n, err := epollWait(l.ep, events, -1)
		if err != nil && err != unix.EINTR {
			break
		}
		for _, ev := range events[:max(n, 0)] {
			fd := int(ev.Fd)
			switch fd {
			case l.efd:
				_, _ = unix.Read(l.efd, b8[:])
				l.mu.Lock()
				added, stop := l.added, l.stopIt
				l.added = nil
				l.mu.Unlock()
				if stop {
					for _, fd := range added {
						unix.Close(fd)
					}
					l.shut()
					return
				}
				for _, fd := range added {
					c := &loopConn{fd: fd}
					l.conns[fd] = c
					if unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}) != nil {
						l.drop(c)
						continue
					}
					l.readable(c) // what came before it was added
				}
			case l.tfd:
				_, _ = unix.Read(l.tfd, b8[:])
				l.armed = 0
			default:
				c := l.conns[fd]
				if c == nil {
					continue
				}
				if ev.Events&unix.EPOLLOUT != 0 && len(c.out) > 0 {
					l.flush(c)
				}
				if l.conns[fd] != nil && ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
					l.readable(c)
				}
			}
		}
		l.answerDue()
	}
	l.shut()
}

// shut closes every connection; the answers still due are not written.
func (l *netLoop) shut() {
	for _, c := range l.conns {
		unix.Close(c.fd)
	}
	clear(l.conns)
	unix.Close(l.ep)
	unix.Close(l.efd)
	unix.Close(l.tfd)
}

func (l *netLoop) drop(c *loopConn) {
	if l.conns[c.fd] != c {
		return
	}
	delete(l.conns, c.fd)
	unix.Close(c.fd)
	// An answer still in the heap for it finds it gone (conns) and is
	// dropped when due; the descriptor's number may be reused by then,
	// hence the pointer compare there.
}

// readable reads what c has (edge-triggered: until EAGAIN) and takes the
// requests that it completes.
func (l *netLoop) readable(c *loopConn) {
	for {
		n, ts, err := l.rx.recv(c.fd, l.buf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil || n == 0 {
			l.drop(c)
			return
		}
		if ts != 0 {
			c.stamp = ts
		} else {
			c.stamp = time.Now().UnixNano()
		}
		c.in = append(c.in, l.buf[:n]...)
		if len(c.in) > maxRequestHead+1<<20 {
			break
		}
	}
	l.requests(c)
}

// requests takes c's complete requests, one at a time: the next waits
// for the answer to the one before (the node and the probe never
// pipeline).
func (l *netLoop) requests(c *loopConn) {
	for !c.pending && !c.close && len(c.in) > 0 {
		end := bytes.Index(c.in, []byte("\r\n\r\n"))
		if end < 0 {
			if len(c.in) > maxRequestHead {
				l.refuse(c)
			}
			return
		}
		head := c.in[:end+4]
		l.br.Reset(bytes.NewReader(head))
		req, err := http.ReadRequest(l.br)
		if err != nil || req.ContentLength < 0 || req.ContentLength > 1<<20 {
			// Chunked bodies are not taken: no caller of this
			// backend sends one.
			l.refuse(c)
			return
		}
		total := len(head) + int(req.ContentLength)
		if len(c.in) < total {
			return
		}
		body := c.in[len(head):total]
		l.call(c, req, body)
		c.in = c.in[:copy(c.in, c.in[total:])]
		if req.Close {
			c.close = true
		}
	}
}

// refuse answers 400 and closes c once that is written.
func (l *netLoop) refuse(c *loopConn) {
	c.in = nil
	c.close = true
	c.out = append(c.out, answerBad...)
	l.flush(c)
}

// call decides the answer to one request, stamped with when its last
// bytes reached the kernel.
func (l *netLoop) call(c *loopConn, req *http.Request, body []byte) {
	ps := l.ps
	ps.calls.Add(1)
	a := &loopAnswer{c: c, read: c.stamp}
	delay := ps.cfg.delay.Nanoseconds()
	switch {
	case ps.cfg.secret != "" && !verifySignature(ps.cfg.secret, req.Header, body, time.Now()):
		ps.bad.Add(1)
		a.b = answerBadSig
	case ps.cfg.deny != "" && bytes.Contains(body, []byte(ps.cfg.deny)):
		ps.denied.Add(1)
		a.b, a.timed = answerRefuse, true
	default:
		a.b, a.timed = answerAllow, true
	}
	if !a.timed || delay <= 0 {
		a.deadline = a.read
		l.write(a)
		return
	}
	// Rounded up to the slice, so that answers due within one leave
	// together: never early.
	d := a.read + delay
	if r := d % l.slice; r != 0 {
		d += l.slice - r
	}
	a.deadline = d
	c.pending = true
	heap.Push(&l.due, a)
}

// answerDue writes the answers whose time has come and arms the timer
// for the next.
func (l *netLoop) answerDue() {
	for len(l.due) > 0 {
		now := time.Now().UnixNano()
		next := l.due[0].deadline
		if next > now && next-now <= l.lead {
			// Woken --lead early (the thread's wake-up on a busy CPU
			// takes about that): the rest is spun.
			for next > now {
				now = time.Now().UnixNano()
			}
		}
		if next > now {
			if wake := next - l.lead; l.armed != wake {
				l.armed = wake
				spec := unix.ItimerSpec{Value: unix.NsecToTimespec(wake)}
				_ = unix.TimerfdSettime(l.tfd, unix.TFD_TIMER_ABSTIME, &spec, nil)
			}
			return
		}
		a := heap.Pop(&l.due).(*loopAnswer)
		c := a.c
		if l.conns[c.fd] != c {
			continue
		}
		c.pending = false
		l.write(a)
		if l.conns[c.fd] == c {
			l.requests(c) // one that came while this was due
		}
	}
}

// write sends a's answer, recording its timing.
func (l *netLoop) write(a *loopAnswer) {
	c := a.c
	c.out = append(c.out, a.b...)
	l.flush(c)
	if a.timed {
		now := time.Now().UnixNano()
		l.ps.mu.Lock()
		l.ps.late.Record(now - a.deadline)
		l.ps.took.Record(now - a.read)
		l.ps.mu.Unlock()
	}
}

// flush writes c.out as far as the socket takes it; the rest goes on
// EPOLLOUT (only a client that stopped reading leaves any).
func (l *netLoop) flush(c *loopConn) {
	for len(c.out) > 0 {
		n, err := rawWrite(c.fd, c.out)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			l.drop(c)
			return
		}
		c.out = c.out[:copy(c.out, c.out[n:])]
	}
	if c.close {
		l.drop(c)
	}
}
