package loop

import (
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/proto"
)

// Chat state on the client listener: signals (typing, cursors), the
// inboxes' rules, read positions, unread counts and receipts.

// Defaults of a connection's signal rate: a typing indicator sends a few
// a second, a burst covers a paste or a reconnect.
const (
	DefaultSignalRate  = 10
	DefaultSignalBurst = 20
)

// mayRead says why c may not join, read the history of or ask the
// presence of room, or "" when it may. An inbox ("@user") is its user's
// alone, whatever the token's rooms.
func (c *conn) mayRead(room []byte) string {
	if proto.IsInbox(room) {
		if !proto.InboxOf(room, c.user) {
			return "an inbox is joined by its own user only"
		}
		return ""
	}
	if !c.rooms.allows(room) {
		return "token does not allow this room"
	}
	return ""
}

// mayWrite says why c may not publish or signal to room, or "": inboxes
// are written by the Server API only.
func (c *conn) mayWrite(room []byte) string {
	if proto.IsInbox(room) {
		return "an inbox is written by the Server API only"
	}
	if !c.rooms.allows(room) {
		return "token does not allow this room"
	}
	return ""
}

// signal hands a client's signal to fanout: the room's publish permission,
// the connection's signal rate, then one frame for every other member of
// the room on every node. Loop only; allocation-free (the frame is carved
// from the loop's arena).
func (c *conn) signal(cmd *proto.Command) {
	l := c.l
	if msg := c.mayWrite(cmd.Room); msg != "" {
		c.sendErr(cmd.Room, proto.CodeForbidden, msg)
		return
	}
	if wait := c.take(&c.m.Chat().SignalTAT, false); wait > 0 {
		l.srv.fan.Stats.SignalsLimited.Add(1)
		c.app.refused[RefusedSignalRate].Add(1)
		c.sendRateLimited(cmd.Room, "signal rate of this connection exceeded: retry after retry_after ms", wait)
		return
	}
	l.table.Signal(&c.m, l.intern(l.roomKey(c, cmd.Room)), cmd.Room, c.user, cmd.Body)
}

// markRead moves the user's read position in the room (answered by fanout
// once the positions goroutine has it). Loop only.
func (c *conn) markRead(cmd *proto.Command) {
	l := c.l
	if !c.mayAsk(cmd.Room) {
		return
	}
	if !l.table.MarkRead(&c.m, l.intern(l.roomKey(c, cmd.Room)), c.user, cmd.Seq) {
		l.srv.Stats.Overloaded.Add(1)
		c.sendErr(cmd.Room, proto.CodeOverloaded, "read positions are behind: retry")
	}
}

// unread asks the user's unread counts in the rooms named (answered by
// fanout). Every room must be one the connection may read. Its errors'
// ref is "": it names no one room.
func (c *conn) unread(cmd *proto.Command) {
	l := c.l
	rooms := make([]string, 0, 8)
	var refused []byte
	proto.RoomList(cmd.Rooms, func(r []byte) {
		if refused == nil && c.mayRead(r) != "" {
			refused = append([]byte(nil), r...)
		}
		rooms = append(rooms, string(r))
	})
	if refused != nil {
		// ref "" as for any unread answer: the request names no one room.
		c.sendErr(nil, proto.CodeForbidden, c.mayRead(refused)+": "+string(refused))
		return
	}
	if !c.admitRead(nil) {
		return
	}
	if !l.table.Unread(&c.m, c.app.id, c.user, rooms) {
		l.srv.Stats.Overloaded.Add(1)
		c.sendErr(nil, proto.CodeOverloaded, "read positions are behind: retry")
	}
}

// receipts asks every user's read position in the room (answered by
// fanout).
func (c *conn) receipts(cmd *proto.Command) {
	l := c.l
	if !c.mayAsk(cmd.Room) {
		return
	}
	if !l.table.Receipts(&c.m, l.intern(l.roomKey(c, cmd.Room))) {
		l.srv.Stats.Overloaded.Add(1)
		c.sendErr(cmd.Room, proto.CodeOverloaded, "read positions are behind: retry")
	}
}

// mayAsk checks a read or receipts request of room: the room's read
// permission, then the connection's rate. It answers a refusal itself.
func (c *conn) mayAsk(room []byte) bool {
	if msg := c.mayRead(room); msg != "" {
		c.sendErr(room, proto.CodeForbidden, msg)
		return false
	}
	return c.admitRead(room)
}

// admitRead applies the connection's rate to read, unread and receipts
// requests (the signal rate, in a bucket of their own), answering the
// refusal itself.
func (c *conn) admitRead(ref []byte) bool {
	if wait := c.take(&c.m.Chat().ReadTAT, true); wait > 0 {
		c.l.srv.fan.Stats.ReadsLimited.Add(1)
		c.app.refused[RefusedReadRate].Add(1)
		c.sendRateLimited(ref, "read request rate of this connection exceeded: retry after retry_after ms", wait)
		return false
	}
	return true
}

// take spends one request of a connection's bucket (GCRA over tat, the
// theoretical arrival time in ns since monoEpoch) at the app's signal
// rate, or its read rate, and returns how long to wait when it is empty,
// else 0. Loop only: the bucket is the connection's, so it needs no
// atomics.
func (c *conn) take(tat *int64, read bool) int64 {
	r := c.chatRate(read)
	if r.Unlimited() {
		return 0
	}
	return r.Take(tat, int64(time.Since(monoEpoch)))
}

// chatRate is the app's signal or read rate (the node's defaults when the
// app is not registered).
func (c *conn) chatRate(read bool) tenancy.Rate {
	if cfg := c.app.cfg.Load(); cfg != nil {
		if read {
			return cfg.ReadRate
		}
		return cfg.SignalRate
	}
	lim := &c.l.srv.apps.lim
	if read {
		return tenancy.NewRate(lim.ReadRate, lim.ReadBurst)
	}
	return tenancy.NewRate(lim.SignalRate, lim.SignalBurst)
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
