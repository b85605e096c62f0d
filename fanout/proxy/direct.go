package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// The direct client: a plain-HTTP call made by the worker itself over a
// connection it keeps, instead of through net/http's Transport.
//
// net/http hands each request to the connection's write goroutine and the
// response back from its read goroutine, and the read goroutine waits for
// the body to be read before it returns the connection to the pool: four
// goroutine hand-offs per call on top of the network's wake-up. On a node
// whose event loops hold the CPU each hand-off waits for a loop to yield,
// and those waits are most of what a hooked publish spends in the node
// (docs/bench-notes/2026-12-01.md, What the node adds to a proxy call). The worker
// here writes the request and reads the answer on its own goroutine: the
// answer's arrival is the only wake-up. A worker makes one call at a time,
// so each keeps its own connections (one per backend host:port), which is
// what the pool of net/http did with as many idle connections as workers.
//
// https targets, and every target when the environment names an HTTP
// proxy (HTTP_PROXY), still go through net/http.

// directOK reports whether the environment lets calls bypass net/http:
// an HTTP proxy configured for plain-HTTP URLs must be honoured.
func directOK() bool {
	return os.Getenv("HTTP_PROXY") == "" && os.Getenv("http_proxy") == ""
}

// endpoint is a target URL as the direct client writes it.
type endpoint struct {
	raw  string // the URL it was parsed from
	addr string // host:port to dial
	host string // the Host header
	path string // the request target
	ok   bool   // plain http: the direct client serves it
}

func parseEndpoint(raw string) endpoint {
	e := endpoint{raw: raw}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil {
		return e
	}
	e.host = u.Host
	e.addr = u.Host
	if u.Port() == "" {
		e.addr = net.JoinHostPort(u.Hostname(), "80")
	}
	e.path = u.RequestURI()
	e.ok = true
	return e
}

// hconn is one kept-alive connection of a worker.
type hconn struct {
	addr string
	nc   net.Conn
	rc   syscall.RawConn  // nc's, for the probe before reuse; nil if none
	lr   io.LimitedReader // nc, limited to one answer's budget
	br   *bufio.Reader    // reads lr

	body io.LimitedReader // an answer's body, limited to maxAnswer+1
	buf  []byte           // the last answer's body

	// writeNow's, kept so that a hand-off allocates nothing for them.
	writeFd func(uintptr)
	wb      []byte
	wsent   int
	werr    error
}

// answerBudget bounds the bytes read from the backend per call: a head
// of 64 KiB (net/http allows megabytes, a hook's answer needs a few
// lines), the answer, and the drain below. A backend sending more fails
// the call at once instead of being read into memory until the timeout.
const answerBudget = 64<<10 + maxAnswer + 1 + drainMost

// drainMost is the most of an answer's rest read so that its connection
// serves the next call.
const drainMost = 64 << 10

// alive reports whether a kept connection can take a request: the
// backend has sent nothing on it since the last answer, not even its
// close. Asked before the request is written, as net/http's read
// goroutine notices the close of an idle connection: a POST written to
// a connection the backend has closed may have been read (the backend
// closed after reading it), so it is never made again once written.
func (h *hconn) alive() bool {
	if h.rc == nil {
		return true
	}
	// Control, not Read: Read fails at once once the last call's
	// deadline, still set on the connection, has passed, and the probe
	// never waits anyway (a read that would block is the answer).
	ok := false
	err := h.rc.Control(func(fd uintptr) {
		var b [1]byte
		_, _, e := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = e == syscall.EAGAIN || e == syscall.EWOULDBLOCK
	})
	return err == nil && ok
}

// maxWorkerConns bounds the connections a worker keeps: an app's connect
// and publish hooks on two hosts, and room for a change of URL.
const maxWorkerConns = 3

// direct is a worker's own state for the direct client.
type direct struct {
	ends  [numKinds]endpoint // by Kind: the last URL parsed
	conns []*hconn
	req   []byte // the request being written, kept between calls
	dial  net.Dialer
}

func (d *direct) endpoint(k Kind, raw string) *endpoint {
	e := &d.ends[k]
	if e.raw != raw || (e.raw == "" && raw == "") {
		*e = parseEndpoint(raw)
	}
	return e
}

// close drops every connection (the worker is going).
func (d *direct) close() {
	for _, h := range d.conns {
		h.nc.Close()
	}
	d.conns = d.conns[:0]
}

// take removes and returns a kept connection to addr, or nil.
func (d *direct) take(addr string) *hconn {
	for i, h := range d.conns {
		if h.addr == addr {
			d.conns = append(d.conns[:i], d.conns[i+1:]...)
			return h
		}
	}
	return nil
}

// drop closes h and removes it from the worker's connections.
func (d *direct) drop(h *hconn) {
	h.nc.Close()
	if i := slices.Index(d.conns, h); i >= 0 {
		d.conns = slices.Delete(d.conns, i, i+1)
	}
}

// keep returns h to the worker's connections, dropping the oldest past
// maxWorkerConns.
func (d *direct) keep(h *hconn) {
	if len(d.conns) >= maxWorkerConns {
		d.conns[0].nc.Close()
		d.conns = append(d.conns[:0], d.conns[1:]...)
	}
	d.conns = append(d.conns, h)
}

// errAnswer is a backend's answer that was read but is not usable.
type errAnswer struct{ msg string }

func (e errAnswer) Error() string { return e.msg }

// roundTrip POSTs body to e with the call's headers and returns the
// answer's body (at most maxAnswer+1 bytes). A kept connection the
// backend has closed (its idle timeout) is dropped before use; one that
// fails while the request is written is retried once on a new one, as
// net/http retries a POST of which nothing could have been read. Once
// the request is written it is never made again: the backend may have
// acted on it.
func (d *direct) roundTrip(e *endpoint, c *Call, body []byte, sg *signing, deadline time.Time) ([]byte, error) {
	if !time.Now().Before(deadline) {
		// Waited in the queue past its timeout: not made, and the kept
		// connection is kept.
		return nil, os.ErrDeadlineExceeded
	}
	d.req = d.request(d.req[:0], e, c, body, sg)
	for attempt := 0; ; attempt++ {
		h := d.take(e.addr)
		if h != nil && !h.alive() {
			h.nc.Close()
			h = nil
		}
		reused := h != nil
		if h == nil {
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			nc, err := d.dial.DialContext(ctx, "tcp", e.addr)
			cancel()
			if err != nil {
				return nil, err
			}
			if tc, ok := nc.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
			h = &hconn{addr: e.addr, nc: nc}
			if sc, ok := nc.(syscall.Conn); ok {
				h.rc, _ = sc.SyscallConn()
			}
			h.lr.R = nc
			h.br = bufio.NewReaderSize(&h.lr, 4<<10)
		}
		b, keep, written, err := h.exchange(d.req, deadline)
		if err == nil || written {
			if keep && err == nil {
				d.keep(h)
			} else {
				h.nc.Close()
			}
			return b, err
		}
		h.nc.Close()
		if !reused || attempt > 0 || !retryable(err) {
			return nil, err
		}
	}
}

// retryable: the error of a kept connection the backend had closed.
func retryable(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// request appends the call's HTTP/1.1 request to b.
func (d *direct) request(b []byte, e *endpoint, c *Call, body []byte, sg *signing) []byte {
	b = append(b, "POST "...)
	b = append(b, e.path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, e.host...)
	b = append(b, "\r\nUser-Agent: roost-proxy\r\nContent-Type: application/json\r\nX-Roost-App: "...)
	b = append(b, c.App...)
	if ts, sig, ok := sg.values(&c.target, body, time.Now()); ok {
		b = append(b, "\r\nX-Roost-Timestamp: "...)
		b = append(b, ts...)
		b = append(b, "\r\nX-Roost-Signature: "...)
		b = append(b, sig...)
	}
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, body...)
}

// exchange writes req and reads the answer. written: all of req was
// written, so the backend may have acted on it and it must not be made
// again; keep: the connection may serve the next call.
func (h *hconn) exchange(req []byte, deadline time.Time) (b []byte, keep, written bool, err error) {
	if err := h.nc.SetDeadline(deadline); err != nil {
		return nil, false, false, err
	}
	if _, err := h.nc.Write(req); err != nil {
		return nil, false, false, err
	}
	h.lr.N = answerBudget
	b, keep, err = h.readAnswer(nil)
	return b, keep, true, err
}

// readAnswer reads the answer to the request written on h; perr is what
// the read that waited for it returned (a parked worker's), nil if none.
func (h *hconn) readAnswer(perr error) (b []byte, keep bool, err error) {
	if perr != nil {
		return nil, false, perr
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return nil, false, err
	}
	// Into the connection's own buffer through its own limit: one
	// allocation each per call otherwise. b is read before the next call.
	h.body.R, h.body.N = resp.Body, maxAnswer+1
	b = h.buf[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, rerr := h.body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, false, rerr
		}
	}
	h.buf = b[:0]
	// The rest is drained (bounded) so that the connection is reused;
	// only a body read to its clean end leaves it at the next answer.
	_, derr := io.CopyN(io.Discard, resp.Body, drainMost)
	keep = !resp.Close && derr == io.EOF && h.br.Buffered() == 0
	if resp.StatusCode/100 != 2 {
		return nil, keep, errAnswer{"status " + resp.Status}
	}
	return b, keep, nil
}

// isTimeout: the call's deadline passed.
func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}
