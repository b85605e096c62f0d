package loop

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/proto"
)

// armSweep starts the sweep timer if it is not running. Loop only.
func (l *loopState) armSweep() {
	if l.sweeping {
		return
	}
	l.sweeping = true
	l.sweepT.Reset(l.srv.sweepEvery())
}

// sweep runs every sweepEvery while the loop has connections: server pings
// after IdleInterval of silence, closes after twice that, finishes upgrades
// that take too long, and closes connections whose token expired. It reads
// l.due and visits only the connections due.
func (l *loopState) sweep() {
	now := l.now()
	l.srv.apps.maybePrune(now)
	l.takeHeld(now)
	l.q.TrimFree()
	defer l.pingsQueued()
	idle := l.srv.cfg.IdleInterval.Milliseconds()
	upTimeout := l.srv.cfg.UpgradeTimeout.Milliseconds()
	l.pingBudget = l.pingShare()
	for i := 0; i < len(l.due); i++ {
		if l.due[i] > now {
			continue
		}
		c := l.conns[i]
		if c.closed {
			continue
		}
		l.sweepConn(c, now, idle, upTimeout)
		if !c.closed {
			l.due[c.pos] = c.dueAt()
		}
	}
}

// sweepConn does what is due for one connection.
func (l *loopState) sweepConn(c *conn, now, idle, upTimeout int64) {
	if c.m.SSE() && c.state == stateOpen {
		l.sweepSSE(c, now, idle)
		return
	}
	silent := now - c.lastRead
	switch {
	case c.state == stateUpgrading && c.awaiting:
		// An SSE request waiting for its connect proxy, whose answer
		// comes within the proxy's timeout.
	case c.state == stateUpgrading:
		if silent >= upTimeout || now-c.opened >= upTimeout {
			c.upgradeTimeout()
		}
	case c.state != stateOpen:
	case c.rooms != nil && now >= c.rooms.expMS:
		c.closeWith(proto.ClosePolicy, []byte("token expired"))
	case silent >= 2*idle:
		c.closeWith(proto.CloseNormal, []byte("idle timeout"))
	case silent >= idle && !c.pinged:
		if l.pingBudget <= 0 {
			return // this sweep's share is spent: the next sweep pings it
		}
		l.pingBudget--
		c.pinged = true
		c.ping()
	}
}

// ping sends a server ping. On an idle connection nothing is queued and
// the transport holds nothing, so the ping is one sendto(2) straight from
// the sweep: no pending list, no flush, and no tick armed behind it.
// Otherwise it queues behind the pending frames like any frame.
func (c *conn) ping() {
	st := &c.l.srv.Stats
	st.Pings.Add(1)
	if c.m.Out.PendingBytes() == 0 && c.gc.OutboundBuffered() == 0 {
		if fd := c.gc.Fd(); fd >= 0 {
			if c.l.queuePing(c, fd) {
				return // it leaves with the sweep's batch
			}
			c.pingSent(sendPing(fd))
			return
		}
	}
	c.send(pingFrame)
}

// pingSent finishes a ping sent straight from the sweep, by sendto(2) or
// through the ring, with what the send returned. A full socket buffer (or
// a 2-byte frame cut in two, which a socket with room never does): the
// frame queues whole; with n > 0 its rest would have to, so the
// connection is beyond saving and is closed.
func (c *conn) pingSent(n int, err error) {
	st := &c.l.srv.Stats
	if n == len(pingFrame) {
		st.FramesOut.Add(1)
		st.Writes.Add(1)
		st.WriteFrames.Observe(1)
		st.BytesOut.Add(uint64(n))
		return
	}
	if (err != nil && err != unix.EAGAIN && err != unix.EINTR) || n > 0 {
		c.fail()
		return
	}
	c.send(pingFrame)
}

// sendPing writes the ping frame to fd with sendto(2). On a socket it does
// what write(2) does without the file layer write passes through first
// (fdget_pos, vfs_write, the iov_iter set-up of sock_write_iter), and
// MSG_NOSIGNAL spares a peer that is gone the SIGPIPE; with 15,000 idle
// connections this write is most of what the node does. The raw call keeps
// the byte count that unix.Sendto drops.
func sendPing(fd int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(pingFrame))),
		uintptr(len(pingFrame)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// pingShare is how many pings one sweep may send: the loop's connections
// spread evenly over the idle interval, twice over. Connections opened
// together (a deploy, a reconnect storm) would otherwise be pinged
// together every interval, thousands of writes in one wake-up of the loop
// that every other connection of the loop waits behind; capped, such a
// clump spreads out over a few sweeps, and the pings stay spread since
// each connection's next ping follows its own answer. At twice the even
// rate a clump of all the loop's connections is through within half an
// interval, so every pong is in long before the idle close.
func (l *loopState) pingShare() int {
	every, idle := l.srv.sweepEvery(), l.srv.cfg.IdleInterval
	return max(64, int(2*int64(len(l.conns))*int64(every)/int64(idle))+1)
}

var pingFrame = proto.AppendControlFrame(nil, 0x9, nil)
var pongFrame = proto.AppendPongFrame(nil)
