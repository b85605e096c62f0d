package loop

import (
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/proto"
)

// Chat state on the client listener: signals (typing, cursors).

// Defaults of a connection's signal rate: a typing indicator sends a few
// a second, a burst covers a paste or a reconnect.
const (
	DefaultSignalRate  = 10
	DefaultSignalBurst = 20
)

// signal hands a client's signal to fanout: the room's publish permission,
// the connection's signal rate, then one frame for every other member of
// the room on every node. Loop only; allocation-free (the frame is carved
// from the loop's arena).
func (c *conn) signal(cmd *proto.Command) {
	l := c.l
	if !c.rooms.allows(cmd.Room) {
		c.sendErr(cmd.Room, proto.CodeForbidden, "token does not allow this room")
		return
	}
	if wait := c.takeSignal(); wait > 0 {
		l.srv.fan.Stats.SignalsLimited.Add(1)
		c.sendRateLimited(cmd.Room, "signal rate of this connection exceeded: retry after retry_after ms", wait)
		return
	}
	l.table.Signal(&c.m, l.intern(l.roomKey(c, cmd.Room)), cmd.Room, c.user, cmd.Body)
}

// takeSignal spends one signal of the connection's bucket (GCRA: sigTAT is
// the theoretical arrival time, ns since monoEpoch) and returns how long
// to wait when it is empty, else 0. Loop only: the bucket is the
// connection's, so it needs no atomics.
func (c *conn) takeSignal() int64 {
	cfg := &c.l.srv.cfg
	if cfg.SignalRate <= 0 {
		return 0
	}
	interval := int64(float64(time.Second) / cfg.SignalRate)
	tolerance := interval * int64(max(cfg.SignalBurst-1, 0))
	now := int64(time.Since(monoEpoch))
	t := max(c.sigTAT, now)
	if wait := t - now - tolerance; wait > 0 {
		return wait
	}
	c.sigTAT = t + interval
	return 0
}

// pushSignal hands a signal to the loop, or drops it with the inbox full:
// a signal is delivered at most once, and unlike a message it leaves no
// gap to repair. Any goroutine.
func (l *loopState) pushSignal(ev fanout.Event) {
	l.mu.Lock()
	if len(l.queue) >= l.srv.cfg.InboxLimit {
		l.mu.Unlock()
		l.srv.fan.Stats.SignalsSkipped.Add(1)
		return
	}
	l.queue = append(l.queue, task{kind: tFanout, ev: ev})
	l.depth.Store(int64(len(l.queue)))
	l.wakeLocked()
}
