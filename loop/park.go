package loop

import (
	"time"

	"golang.org/x/sys/unix"
)

// park remembers a connection whose frames wait for gnet to drain what the
// kernel refused; every tick checks it (unpark).
func (l *loopState) park(c *conn) {
	if c.m.Out.Park() {
		l.parked = append(l.parked, c)
	}
}

// unpark writes the parked connections whose transport has drained, and
// refreshes the backlog of the others (the outbound limit counts it).
func (l *loopState) unpark() {
	if len(l.parked) == 0 {
		return
	}
	ps := l.parked
	l.parked = l.spareParked[:0]
	for i, c := range ps {
		ps[i] = nil
		c.m.Out.Unpark()
		if c.closed || c.state != stateOpen {
			continue
		}
		c.m.Out.SetBacklog(c.gc.OutboundBuffered())
		if c.m.Out.Backlog() > 0 {
			l.park(c)
			continue
		}
		l.write(c)
	}
	l.spareParked = ps[:0]
}

// lingerMax bounds a closing handshake: how long a connection whose close
// frame was sent waits for it to leave and for the client's answer (its
// close frame or EOF) before the socket is closed anyway. A browser
// answers within a round trip; one that does not (gone, or not reading)
// costs its descriptor this long at most.
const lingerMax = time.Second

// lingerSlack batches the linger timer: one firing closes every
// connection due within this much, so a drain round's closes take one
// wake-up, not one each. Early is harmless: the client had most of
// lingerMax to answer.
const lingerSlack = 50 * time.Millisecond

type linger struct {
	c     *conn
	until int64 // Unix ms
	shut  bool  // the close frame has left and the write side is shut
}

// lingerClose waits for c's closing handshake to finish (closeWith). Its
// close frame is in gnet or the kernel; once gnet holds nothing more the
// write side is shut, so a FIN follows the frame. The client's close frame
// then closes the socket (OnTraffic), as does its EOF (gnet); the linger
// timer closes what is left at lingerMax. A close frame still in gnet is
// watched by the flush tick (unshut), the rest only by the linger timer:
// no goroutine per connection, no tick for a loop that only waits.
func (l *loopState) lingerClose(c *conn) {
	lg := linger{c: c, until: l.now() + lingerMax.Milliseconds()}
	if !l.shutWrite(&lg) {
		l.unshut++
	}
	if c.closed {
		return
	}
	l.lingers = append(l.lingers, lg)
	l.armLinger()
}

// shutWrite shuts the write side of lg's socket once gnet has handed
// everything to the kernel, and reports whether it is shut.
func (l *loopState) shutWrite(lg *linger) bool {
	if lg.shut {
		return true
	}
	gc := lg.c.gc
	if gc.OutboundBuffered() > 0 {
		return false
	}
	lg.shut = true
	if fd := gc.Fd(); fd >= 0 {
		_ = unix.Shutdown(fd, unix.SHUT_WR) // ENOTCONN: the peer is gone already; the close is what is left
	} else {
		_ = gc.Close() // no socket (tests' in-memory transport): no handshake to wait for
	}
	return true
}

// armLinger arms the linger timer for the earliest deadline, if it is not
// armed. Loop only.
func (l *loopState) armLinger() {
	if l.lingerArmed || len(l.lingers) == 0 {
		return
	}
	first := l.lingers[0].until
	for _, lg := range l.lingers[1:] {
		first = min(first, lg.until)
	}
	l.lingerArmed = true
	l.lingerT.Reset(max(time.Duration(first-l.now())*time.Millisecond, 0) + lingerSlack/2)
}

// closeLingering shuts the write side of the lingering connections whose
// close frame has left, and closes those that are out of time. The flush
// tick calls it while some close frame is still in gnet, the linger timer
// at the deadlines.
func (l *loopState) closeLingering() {
	if len(l.lingers) == 0 {
		return
	}
	now := l.now()
	keep := l.lingers[:0]
	unshut := 0
	for _, lg := range l.lingers {
		if lg.c.closed {
			continue
		}
		if now+lingerSlack.Milliseconds() >= lg.until {
			_ = lg.c.gc.Close()
			continue
		}
		if !l.shutWrite(&lg) {
			unshut++
		}
		if !lg.c.closed {
			keep = append(keep, lg)
		}
	}
	clear(l.lingers[len(keep):])
	l.lingers = keep
	l.unshut = unshut
}
