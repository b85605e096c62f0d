//go:build linux

package loop

import (
	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/loop/internal/uring"
)

// What an idle node does is ping: with 15,000 idle connections, 600 pings
// a second and 600 pongs back, each ping a sendto(2) of its own and each
// pong an epoll wake-up and a read(2) (docs/bench-notes/2026-12-01.md, "What an idle
// node still woke for"). Both go through the loop's ring here instead.
//
// The sweep queues its pings on the ring and submits them in batches, one
// io_uring_enter(2) for up to uring.Batch/2 pings. Ahead of each ping, in the
// same batch, the socket's SO_RCVLOWAT is raised to 7 bytes (an io_uring
// socket command, Linux 6.7 and later): the client's answer, a masked pong
// with no payload, is 6 bytes, so it stays in the socket and wakes
// nothing, while any frame with a payload (7 bytes or more) wakes the loop
// as before. Such a connection is held. The next sweep, a second later,
// peeks at each held socket (in batches again): a lone pong is taken out
// of the socket and counted as the connection's input; for anything else
// (other bytes, nothing but a connection that has spoken or is closing)
// the watermark goes back to 1 and the bytes are read as usual. Either way
// the watermark is reset in the same batch. A connection that does not
// answer stays held and pinged, and the sweep closes it at the same time
// as before.
//
// What a client sees: a frame of 6 bytes or less (one with no payload: a
// pong, a ping, an empty close) sent while its connection is held waits
// for the next sweep, up to a second; and since a pong is taken at the
// sweep after it came, the next ping comes up to a second later than an
// interval after the pong.
//
// Where the kernel refuses the socket command (before 6.7, or a seccomp
// profile: EINVAL, EOPNOTSUPP) the loop stops holding and only batches the
// pings.

// holdLowat is one byte more than a client's empty pong (2 bytes of
// header, 4 of mask).
const holdLowat = 7

// holdCmd is the socket command that sets SO_RCVLOWAT: a variable so that
// a test can name one the kernel does not know, to see the refusal.
var holdCmd uint32 = uring.CmdSetsockopt

// pingFrames is the ping as the ring sends it, one frame.
var pingFrames = [][]byte{pingFrame}

type idleKind uint8

const (
	idlePing   idleKind = iota + 1 // the ping frame
	idleHold                       // SO_RCVLOWAT to holdLowat, ahead of the ping
	idlePeek                       // MSG_PEEK at a held socket
	idleTake                       // the lone pong out of the socket
	idleUnhold                     // SO_RCVLOWAT back to 1
)

// idleState is the loop's share of the above.
type idleState struct {
	kind [uring.Batch]idleKind
	buf  [uring.Batch][8]byte // a peek's bytes: 8, to tell a lone pong from more
	// held: connections whose watermark was raised, for the next sweep.
	// take and unhold: what that sweep's peeks found.
	held, spare, take, unhold []*conn
	// noHold: the kernel refused the socket command; from then on the
	// pings are batched and nothing is held.
	noHold bool
	// The option values the kernel reads during the submit: 1, holdLowat.
	lowat [2]int32
	now   int64 // the sweep's clock, for the pongs it takes
}

// queuePing queues c's ping (and its hold) on the ring; false: no ring, the
// caller sends it. The batch leaves when full or when the sweep ends
// (pingsQueued).
func (l *loopState) queuePing(c *conn, fd int) bool {
	r := l.sendRing()
	if r == nil {
		return false
	}
	l.idleRoom(2)
	if !l.idle.noHold {
		l.idleLowat(c, fd, holdLowat, idleHold)
	}
	l.idleQueued(c, r.Send(fd, pingFrames), idlePing)
	return true
}

// pingsQueued ends the sweep's use of the ring: connections held and
// since closed by the sweep (the idle close, an expired token) get their
// watermark back now, so that the client's answer to the close frame,
// which may be an empty close of 6 bytes, is read within the linger.
func (l *loopState) pingsQueued() {
	r := l.ring
	if r == nil {
		return
	}
	if r.Len() > 0 {
		l.idleSubmit() // the last pings: a failed one closes its connection
	}
	keep := l.idle.held[:0]
	for _, c := range l.idle.held {
		switch {
		case c.closed:
		case c.state != stateOpen:
			l.idleRoom(1)
			l.idleUnhold(c)
		default:
			keep = append(keep, c)
		}
	}
	clear(l.idle.held[len(keep):])
	l.idle.held = keep
	if r.Len() > 0 {
		l.idleSubmit()
	}
}

// takeHeld looks at the connections held since the last sweep: a lone pong
// is taken as their input, and every other one goes back to the usual
// watermark unless it is still waiting for its pong. now is the sweep's
// clock.
func (l *loopState) takeHeld(now int64) {
	id := &l.idle
	if len(id.held) == 0 || l.ring == nil {
		return
	}
	id.now = now
	held := id.held
	id.held = id.spare[:0]
	for _, c := range held {
		switch {
		case c.closed:
		case c.state != stateOpen || !c.pinged:
			// It has spoken since (a frame of 7 bytes or more woke the
			// loop), or is closing: nothing to take.
			id.unhold = append(id.unhold, c)
		default:
			fd := c.gc.Fd()
			if fd < 0 {
				continue
			}
			l.idleRoom(1)
			l.idleRecv(c, fd, len(id.buf[0]), unix.MSG_PEEK, idlePeek)
		}
	}
	if l.ring.Len() > 0 {
		l.idleSubmit()
	}
	clear(held)
	id.spare = held[:0]
	for _, c := range id.take {
		if c.closed {
			continue
		}
		fd := c.gc.Fd()
		if fd < 0 {
			continue
		}
		l.idleRoom(2)
		l.idleRecv(c, fd, len(pongHeld), 0, idleTake)
		l.idleUnhold(c)
	}
	for _, c := range id.unhold {
		if c.closed {
			continue
		}
		l.idleRoom(1)
		l.idleUnhold(c)
	}
	clear(id.take)
	clear(id.unhold)
	id.take, id.unhold = id.take[:0], id.unhold[:0]
	if l.ring.Len() > 0 {
		l.idleSubmit()
	}
}

// pongHeld is the length of the frame a held socket keeps.
var pongHeld = [holdLowat - 1]byte{}

// isPong reports whether b is exactly one client pong with no payload:
// FIN and opcode 0xA, the mask bit and length 0, and the 4 mask bytes.
func isPong(b []byte) bool {
	return len(b) == len(pongHeld) && b[0] == 0x8A && b[1] == 0x80
}

// idleRoom submits the batch when fewer than k entries fit. Entries the
// flush queued and has not submitted (none at a sweep: every writer of
// the ring submits before it returns) are sent first, as the flush would.
func (l *loopState) idleRoom(k int) {
	r := l.ring
	if r.Len() > 0 && l.idle.kind[0] == 0 {
		l.sendQueued()
	}
	if r.Len()+k > uring.Batch {
		l.idleSubmit()
	}
}

// idleQueued records operation i of the batch as c's, of kind k.
func (l *loopState) idleQueued(c *conn, i int, k idleKind) {
	l.ringConns[i] = c
	l.idle.kind[i] = k
}

// idleRecv queues a non-blocking recv(2) of up to n bytes on c's socket
// into the buffer of the batch's next entry.
func (l *loopState) idleRecv(c *conn, fd, n int, flags uint32, k idleKind) {
	i := l.ring.Len()
	l.idleQueued(c, l.ring.Recv(fd, l.idle.buf[i][:n], flags), k)
}

func (l *loopState) idleUnhold(c *conn) {
	if fd := c.gc.Fd(); fd >= 0 {
		l.idleLowat(c, fd, 1, idleUnhold)
	}
}

// idleLowat queues setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, v) as a socket
// command, v being 1 or holdLowat.
func (l *loopState) idleLowat(c *conn, fd int, v int32, k idleKind) {
	id := &l.idle
	id.lowat = [2]int32{1, holdLowat}
	p := &id.lowat[0]
	if v != 1 {
		p = &id.lowat[1]
	}
	l.idleQueued(c, l.ring.SocketCmd(holdCmd, fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, p), k)
}

// idleSubmit sends the batch and finishes each of its entries.
func (l *loopState) idleSubmit() {
	r, id := l.ring, &l.idle
	n := r.Submit()
	for i := 0; i < n; i++ {
		c, k := l.ringConns[i], id.kind[i]
		l.ringConns[i], id.kind[i] = nil, 0
		res, taken := r.Result(i)
		switch k {
		case idlePing:
			if c.closed || c.state != stateOpen {
				continue
			}
			var n int
			var err error
			switch {
			case !taken:
				if fd := c.gc.Fd(); fd >= 0 {
					n, err = sendPing(fd)
				}
			case res >= 0:
				n = int(res)
			default:
				err = unix.Errno(-res)
			}
			c.pingSent(n, err)
		case idleHold:
			switch {
			case !taken:
			case res == 0:
				id.held = append(id.held, c)
				l.srv.Stats.PongsHeld.Add(1)
			case res == -int32(unix.EINVAL) || res == -int32(unix.EOPNOTSUPP):
				id.noHold = true
			}
		case idlePeek:
			switch {
			case c.closed:
			case !taken || res == -int32(unix.EAGAIN) || res == -int32(unix.EINTR):
				id.held = append(id.held, c) // nothing yet: still held
			case res == int32(len(pongHeld)) && isPong(id.buf[i][:res]):
				id.take = append(id.take, c)
			default:
				// More than a pong, part of a frame, EOF or an error:
				// the usual read path has it once the watermark is 1.
				id.unhold = append(id.unhold, c)
			}
		case idleTake:
			if taken && res == int32(len(pongHeld)) && !c.closed && c.state == stateOpen {
				l.srv.Stats.PongsTaken.Add(1)
				l.srv.Stats.FramesIn.Add(1)
				c.lastRead = id.now
				c.pinged = false
				l.due[c.pos] = c.dueAt()
			}
		case idleUnhold:
			if !taken && !c.closed {
				id.held = append(id.held, c) // the next sweep tries again
			}
		}
	}
}
