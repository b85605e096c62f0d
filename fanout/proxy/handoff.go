package proxy

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/bytedance/sonic"
	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/fanout/hooknet"
)

// beforeGive, when set, runs in handOff after the write and before the call
// is given to the worker: the window an answer can beat. A variable a test
// sets (on the goroutine that asks), so that Proxy carries nothing for it.
var beforeGive func()

// The hand-off: a call written by the asking loop itself onto a worker's
// kept-alive connection.
//
// A worker that has answered a call and finds no other queued parks on
// its last connection: it waits in a read of it, the way it would wait
// for an answer. Ask takes the most recently parked worker of the app,
// writes the request (non-blocking: a few hundred bytes into an idle
// socket) and returns; the backend's answer wakes the worker in its read,
// and it hands the verdict to Done as any worker does. Through the queue
// a call waited for a worker to be scheduled before its request even
// left, a goroutine wake-up that on a node whose loops hold the CPU costs
// about what the loop's own turn does (docs/bench-notes/2026-12-01.md, What the node
// adds to a proxy call); now the request leaves with the loop's turn, and
// the answer's arrival is the call's only wake-up besides the loop's.
//
// A parked worker's read can end four ways: the answer to a call written
// to it; the backend closing the idle connection or sending unasked
// bytes (the connection is dropped); its idle time (the worker goes);
// or one of the sentinels below, stored by whoever took it off the
// parked list instead of a call.

// worker is one worker's state, also what a loop uses of it while the
// worker is parked and taken for a call.
type worker struct {
	sg signing
	d  direct
	h  *hconn // parked on it
	// call: the call written to h, or a sentinel; stored by whoever took
	// the worker off the parked list, once (after the write, so that the
	// worker reads the answer only when the call is the loop's no more),
	// through give.
	call atomic.Pointer[Call]
	// given wakes a worker whose read ended before call was stored: an
	// answer that came while the loop was still in its write(2). The
	// worker must not spin for it (runtime.Gosched): on a node of one P
	// the spin keeps the loop from the P it needs to store the call, and
	// a backend answering in under a millisecond cost the node 20,000
	// rounds per such wait and 30-90% more CPU per frame
	// (docs/benchmarks.md).
	given chan struct{}
}

func newWorker() *worker {
	w := &worker{given: make(chan struct{}, 1)}
	w.d.dial.Control = hooknet.Default.Control // link-local and the node's own listeners are refused
	return w
}

// give stores what the worker taken off the parked list is to do, and
// wakes it if its read ended first. A token left from an earlier give
// (the worker did not wait then) only makes the worker load call once
// more: give stores before it signals, so a worker that finds call nil
// after taking a token finds the channel empty and the next give's
// token comes.
func (w *worker) give(c *Call) {
	w.call.Store(c)
	select {
	case w.given <- struct{}{}:
	default:
	}
}

// Sentinels a worker taken off the parked list may find instead of a call.
var (
	kicked  = new(Call) // go back to the queue: a call there waits for a worker, or this one's connection is to another host
	dropped = new(Call) // the connection was closed (a write failed): drop it and go back to the queue
	closing = new(Call) // the pool closed: go
)

// past is a deadline already gone: set on a parked connection, it ends
// the worker's read at once.
var past = time.Unix(1, 0)

type parkResult uint8

const (
	parkAgain parkResult = iota // answered a call: park again or take from the queue
	parkQueue                   // take calls from the queue
	parkExit                    // idle or closing: the worker goes
)

// handOff writes c to a parked worker's connection. false: no worker was
// parked for c's backend, or the write failed before any of it left; c
// goes through the queue.
func (p *Pool) handOff(q *appQueue, c *Call) bool {
	q.mu.Lock()
	n := len(q.parked)
	if n == 0 {
		q.mu.Unlock()
		return false
	}
	w := q.parked[n-1]
	q.parked[n-1] = nil
	q.parked = q.parked[:n-1]
	q.mu.Unlock()
	h := w.h
	e := w.d.endpoint(c.Kind, c.target.URL)
	if !e.ok || e.addr != h.addr {
		// The worker, kicked back to the queue, takes c there.
		p.release(w, kicked)
		return false
	}
	body, err := sonic.Marshal(&request{Type: KindNames[c.Kind], App: c.App, User: c.User, Room: c.Room, ID: c.ID, Body: c.Body, Client: c.Client})
	if err != nil {
		p.release(w, kicked)
		return false
	}
	w.d.req = w.d.request(w.d.req[:0], e, c, body, &w.sg)
	if h.nc.SetReadDeadline(c.asked.Add(c.target.Timeout)) != nil {
		h.nc.Close()
		w.give(dropped)
		return false
	}
	sent, err := h.writeNow(w.d.req)
	if sent == 0 && err != nil {
		h.nc.Close()
		w.give(dropped)
		return false
	}
	if sent < len(w.d.req) {
		// The socket took part of it (a backend that stopped reading):
		// the rest must not wait in the loop.
		rest := slices.Clone(w.d.req[sent:])
		deadline := c.asked.Add(c.target.Timeout)
		go func() {
			_ = h.nc.SetWriteDeadline(deadline)
			if _, err := h.nc.Write(rest); err != nil {
				h.nc.Close() // the worker's read fails: the call is answered Failed
			}
		}()
	}
	if beforeGive != nil {
		beforeGive()
	}
	w.give(c)
	return true
}

// release gives a worker taken off the parked list back to itself with s
// instead of a call, ending its read.
func (p *Pool) release(w *worker, s *Call) {
	_ = w.h.nc.SetReadDeadline(past)
	w.give(s)
}

// writeNow writes b without waiting: what the socket takes now.
func (h *hconn) writeNow(b []byte) (int, error) {
	if h.rc == nil {
		return 0, unix.EINVAL
	}
	if h.writeFd == nil {
		// Bound once: a closure made per call would escape to Control
		// and cost allocations on every hand-off.
		h.writeFd = h.writeSome
	}
	h.wb, h.wsent, h.werr = b, 0, nil
	err := h.rc.Control(h.writeFd)
	sent, werr := h.wsent, h.werr
	h.wb, h.werr = nil, nil
	if err != nil {
		return sent, err
	}
	return sent, werr
}

func (h *hconn) writeSome(fd uintptr) {
	for h.wsent < len(h.wb) {
		n, err := unix.Write(int(fd), h.wb[h.wsent:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			h.werr = err
			return
		}
		h.wsent += n
	}
}

// kick sends one parked worker back to the queue, where a call waits
// that no worker would take otherwise (every worker the app may have is
// running, and some are parked).
func (p *Pool) kick(q *appQueue) {
	q.mu.Lock()
	n := len(q.parked)
	if n == 0 {
		q.mu.Unlock()
		return
	}
	w := q.parked[n-1]
	q.parked[n-1] = nil
	q.parked = q.parked[:n-1]
	q.mu.Unlock()
	p.release(w, kicked)
}

// closeParked ends every parked worker of q (the pool closed).
func (p *Pool) closeParked(q *appQueue) {
	q.mu.Lock()
	ws := q.parked
	q.parked = nil
	q.mu.Unlock()
	for _, w := range ws {
		p.release(w, closing)
	}
}

// park waits on w's last connection for a call written to it. The
// connection stays in w.d.conns throughout (the loop writes on it; only
// the worker closes or drops it).
func (p *Pool) park(q *appQueue, w *worker) parkResult {
	h := w.d.conns[len(w.d.conns)-1]
	h.lr.N = answerBudget
	if h.nc.SetReadDeadline(time.Now().Add(idleExit)) != nil {
		w.d.drop(h)
		return parkQueue
	}
	q.mu.Lock()
	if len(q.ch) > 0 || q.closed {
		q.mu.Unlock()
		return parkQueue
	}
	w.h = h
	q.parked = append(q.parked, w)
	q.mu.Unlock()
	for {
		_, err := h.br.Peek(1)
		c := w.call.Load()
		if c == nil {
			q.mu.Lock()
			i := slices.Index(q.parked, w)
			if i >= 0 {
				q.parked = slices.Delete(q.parked, i, i+1)
			}
			q.mu.Unlock()
			if i >= 0 {
				// Not taken: the backend closed the connection or sent
				// what was not asked for, or the worker was idle.
				w.h = nil
				w.d.drop(h)
				if err != nil && isTimeout(err) {
					return parkExit
				}
				return parkQueue
			}
			// Taken: whoever took it gives it what to do next in a moment.
			for c = w.call.Load(); c == nil; c = w.call.Load() {
				<-w.given
			}
		}
		switch c {
		case kicked, closing, dropped:
			w.call.Store(nil)
			w.h = nil
			if c == dropped {
				w.d.drop(h)
			}
			if c == closing {
				return parkExit
			}
			return parkQueue
		}
		if err != nil && isTimeout(err) && time.Now().Before(c.asked.Add(c.target.Timeout)) {
			// The idle deadline ended the read before the call's own
			// replaced it: read again, to the call's.
			continue
		}
		b, keep, rerr := h.readAnswer(err)
		w.call.Store(nil)
		w.h = nil
		if !keep || rerr != nil {
			w.d.drop(h)
		}
		p.finish(q, c, b, rerr, c.asked)
		return parkAgain
	}
}
