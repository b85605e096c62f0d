// Package httpedge is the connection budget of the node's net/http
// listeners (the server API and the admin listener): a listener whose
// Accept never waits, and a pool of connections with a cap in which the
// oldest idle connection gives way to a new one.
//
// A listener that waits at Accept past its cap (x/net/netutil's
// LimitListener) lets whoever holds the connections decide who is served:
// a few idle keep-alive sockets, never asked for a secret, shut every
// backend out for as long as the idle timeout, renewable at will. Here a
// connection that is not being answered (net/http's StateNew, a request
// head not yet read, or StateIdle, between requests) holds its place only
// until a newer one needs it; a connection whose handler runs is kept, and
// only when every counted connection is running a handler is a new one
// turned away, with an answer. A caller may Release a connection from the
// pool once it has proved who it is (the server API, after a valid
// secret): it is then budgeted by the caller, and no longer evictable.
//
// Lock order: Listener.mu only; no other lock is taken while it is held,
// and no connection is closed under it.
package httpedge

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Config is a listener's budget.
type Config struct {
	// Max is the connections counted at once (at least 1).
	Max int
	// PerAddr is the connections of one client address counted at once (0:
	// no cap of its own): past it, that address's own oldest idle
	// connection gives way, so one address cannot push out the others'.
	PerAddr int
	// Busy is the whole HTTP answer written to a connection turned away
	// because every counted connection is running a handler (nil: closed
	// without a word).
	Busy []byte
}

// Stats are a listener's counters.
type Stats struct {
	Accepted atomic.Uint64 // connections taken from the kernel
	Evicted  atomic.Uint64 // idle connections closed to make room for a new one
	Refused  atomic.Uint64 // new connections turned away: every counted one was busy
	Counted  atomic.Int64  // connections in the pool now
}

// Listener wraps a net.Listener with the pool. Serve it with an
// http.Server whose ConnState is the listener's ConnState.
type Listener struct {
	net.Listener
	cfg   Config
	Stats Stats

	mu     sync.Mutex
	n      int
	idle   ring // counted connections not running a handler, oldest first
	byAddr map[netip.Addr]*addrPool
}

// addrPool is one client address's part of the pool.
type addrPool struct {
	n    int
	idle ring
}

// New wraps l.
func New(l net.Listener, cfg Config) *Listener {
	cfg.Max = max(1, cfg.Max)
	return &Listener{Listener: l, cfg: cfg, byAddr: map[netip.Addr]*addrPool{}}
}

// Conn is a connection of a Listener (what its Accept returns, and what
// net/http hands to ConnState and ConnContext).
type Conn struct {
	net.Conn
	l    *Listener
	Addr netip.Addr // the client's address, unmapped

	// Guarded by l.mu.
	counted bool
	idle    bool
	ap      *addrPool
	pushed  chan struct{} // closed when a newcomer pushes c out
	all     link          // in l.idle
	own     link          // in the address's idle ring
	onClose func()
	closed  bool
}

// link is a place in a ring of idle connections.
type link struct{ prev, next *Conn }

// ring is a doubly linked list of connections threaded through one of
// their links (all or own): O(1) to add, remove and take the oldest.
type ring struct {
	head, tail *Conn
	own        bool // threaded through Conn.own, not Conn.all
}

func (r *ring) link(c *Conn) *link {
	if r.own {
		return &c.own
	}
	return &c.all
}

func (r *ring) push(c *Conn) {
	l := r.link(c)
	l.prev, l.next = r.tail, nil
	if r.tail != nil {
		r.link(r.tail).next = c
	} else {
		r.head = c
	}
	r.tail = c
}

func (r *ring) remove(c *Conn) {
	l := r.link(c)
	if l.prev != nil {
		r.link(l.prev).next = l.next
	} else {
		r.head = l.next
	}
	if l.next != nil {
		r.link(l.next).prev = l.prev
	} else {
		r.tail = l.prev
	}
	l.prev, l.next = nil, nil
}

// addrOf is the client's address of c; the zero Addr for a connection that
// is not TCP (one pool for all of them).
func addrOf(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// Accept takes the next connection from the kernel and gives it a place
// in the pool, closing the oldest idle connection when the pool is full.
// It never waits for a place: a full pool of busy connections turns the
// new one away (with Config.Busy) and Accept takes the next.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.Stats.Accepted.Add(1)
		c := &Conn{Conn: nc, l: l, Addr: addrOf(nc), pushed: make(chan struct{})}
		victim, ok := l.admit(c)
		if victim != nil {
			l.Stats.Evicted.Add(1)
			_ = victim.Conn.Close() // its goroutine's read fails; its Close then finds it uncounted
		}
		if ok {
			return c, nil
		}
		l.Stats.Refused.Add(1)
		select {
		case turning <- struct{}{}:
			go func() {
				defer func() { <-turning }()
				turnAway(nc, l.cfg.Busy)
			}()
		default:
			_ = nc.Close() // answering costs a goroutine each; enough are at it
		}
	}
}

// admit counts c, choosing the connection that gives way to it (nil: none
// needed); ok false: none could, c is not counted.
func (l *Listener) admit(c *Conn) (victim *Conn, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ap := l.byAddr[c.Addr]
	if ap == nil {
		ap = &addrPool{idle: ring{own: true}}
		l.byAddr[c.Addr] = ap
	}
	full := l.cfg.PerAddr > 0 && ap.n >= l.cfg.PerAddr
	if full {
		victim = ap.idle.head
	} else if l.n >= l.cfg.Max {
		full, victim = true, l.idle.head
	}
	if full && victim == nil {
		if ap.n == 0 {
			delete(l.byAddr, c.Addr)
		}
		return nil, false
	}
	if victim != nil {
		l.uncountLocked(victim)
		close(victim.pushed)
		l.byAddr[c.Addr] = ap // the victim may have been the address's last
	}
	c.counted, c.idle, c.ap = true, true, ap
	l.n++
	ap.n++
	l.idle.push(c)
	ap.idle.push(c)
	l.Stats.Counted.Store(int64(l.n))
	return victim, true
}

// turning bounds the goroutines answering connections turned away.
var turning = make(chan struct{}, 64)

// turnAway answers a connection the pool has no place for and closes it.
// The answer is written before the request is read: a client that has
// sent its request may see a reset instead, which is still no wait.
func turnAway(c net.Conn, busy []byte) {
	if len(busy) > 0 {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(busy)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
			// Read what the client sent so that the close is a FIN, not a
			// reset that would discard the answer at the client.
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			var buf [4096]byte
			for {
				if _, err := c.Read(buf[:]); err != nil {
					break
				}
			}
		}
	}
	_ = c.Close()
}

// uncountLocked takes c out of the pool.
func (l *Listener) uncountLocked(c *Conn) {
	if !c.counted {
		return
	}
	if c.idle {
		l.idle.remove(c)
	}
	ap := c.ap
	if c.idle {
		ap.idle.remove(c)
	}
	c.counted, c.idle = false, false
	l.n--
	if ap.n--; ap.n == 0 {
		delete(l.byAddr, c.Addr)
	}
	l.Stats.Counted.Store(int64(l.n))
}

// ConnState is the http.Server's ConnState: a connection running a handler
// is not evictable, one between requests is again.
func (l *Listener) ConnState(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*Conn)
	if !ok || c.l != l {
		return
	}
	switch s {
	case http.StateActive:
		l.setIdle(c, false)
	case http.StateIdle:
		l.setIdle(c, true)
	case http.StateClosed, http.StateHijacked:
		l.release(c)
	}
}

func (l *Listener) setIdle(c *Conn, idle bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.counted || c.idle == idle {
		return
	}
	c.idle = idle
	ap := c.ap
	if idle {
		l.idle.push(c)
		ap.idle.push(c)
	} else {
		l.idle.remove(c)
		ap.idle.remove(c)
	}
}

// PushedOut is closed when a newcomer pushes c out of the pool (c is then
// closed): a handler waiting after Wait(true) stops at it. The request's
// context ends too, but only once net/http reads the connection again,
// which it does not while a request body is unread.
func (c *Conn) PushedOut() <-chan struct{} { return c.pushed }

// Wait marks c, whose handler runs, as idle (true: a newer connection
// may push it out, which closes it) or running again (false). A handler
// that makes its client wait for an answer calls it around the wait, so
// that waiting costs no place a newcomer needs.
func (c *Conn) Wait(waiting bool) {
	c.l.setIdle(c, waiting)
}

// Release takes c out of its listener's pool (it is no longer counted nor
// evictable) and sets the function its close calls (nil: none). Call it
// from the handler of c's request, once, when c has proved it may hold a
// place budgeted elsewhere. It reports false when c is closed already:
// then onClose is not called, and the caller keeps nothing for c.
func (c *Conn) Release(onClose func()) bool {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closed {
		return false
	}
	l.uncountLocked(c)
	c.onClose = onClose
	return true
}

// Counted reports whether c is in its listener's pool (not Released).
func (c *Conn) Counted() bool {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	return c.counted
}

// release is c's end: out of the pool, and its onClose called once.
func (l *Listener) release(c *Conn) {
	l.mu.Lock()
	if c.closed {
		l.mu.Unlock()
		return
	}
	c.closed = true
	l.uncountLocked(c)
	f := c.onClose
	c.onClose = nil
	l.mu.Unlock()
	if f != nil {
		f()
	}
}

// Close closes the connection and gives its place back.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.l.release(c)
	return err
}
