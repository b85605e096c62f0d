//go:build linux

package bench

import (
	"strconv"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/proto"
)

// --read-marks: every receiver marks each message it receives as read,
// as a client showing the room would, so that a run measures what read
// positions cost: the node's positions goroutine, the broadcast to the
// user's other connections, and the database's coalesced writes (the
// latest mark per user and room, once a second: the node's
// roost_read_marks_written_total against the marks sent says how much
// coalescing saved). Compared with the same run without it, the
// database's CPU gives its cost per read mark and per position written
// (docs/capacity.md).

// markRead queues {"op":"read","room":R,"seq":SEQ} on c.
func (l *loop) markRead(c *conn, seq uint64, now int64) {
	p := append(l.scratch[:0], `{"op":"read","room":"`...)
	p = append(p, c.room...)
	p = append(p, `","seq":`...)
	p = strconv.AppendUint(p, seq, 10)
	p = append(p, '}')
	l.scratch = p
	c.out = proto.AppendClientFrame(c.out, ws.OpText, l.mask(), p)
	l.markDirty(c)
	if l.inWindow(now) {
		l.st.ReadMarks++
	}
}
