package loop

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/proto"
)

// Server-Sent Events: GET /sse?room=a&room=b is a listen-only stream of the
// rooms' messages, served by the same loops, limits and outbound budget as
// WebSocket. The connection is a conn like any other; its fanout.Member is
// marked SSE, so the table queues events (built once per message and
// shared) with the member's own id line behind each, and the loop writes
// them per tick like frames. It reads nothing after the request head.

var (
	errSSENoRoom    = &proto.HTTPError{Status: 400, Reason: "name at least one room: /sse?room=NAME"}
	errSSEBadRoom   = &proto.HTTPError{Status: 400, Reason: "room must match [A-Za-z0-9_.:-]{1,128}"}
	errSSEQuery     = &proto.HTTPError{Status: 400, Reason: "malformed query: bad percent-escape"}
	errSSEForbidden = &proto.HTTPError{Status: 403, Reason: "token does not allow one of the rooms"}
	errSSENoToken   = &proto.HTTPError{Status: 401, Reason: "missing token: connect with /sse?room=NAME&token=JWT or Authorization: Bearer JWT"}
)

// ssePing is the keep-alive comment of an idle stream.
var ssePing = []byte(": ping\n\n")

// sseHead opens every stream (the node header and the retry field follow).
const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
	"Access-Control-Allow-Origin: *\r\nX-Accel-Buffering: no\r\nConnection: close\r\n"

// sseRoom is one room of a request: its name in l.sseBuf and where the
// client resumes it.
type sseRoom struct {
	start, end int
	since      uint64
	hasSince   bool
}

// openSSE answers GET /sse: it checks identity, rooms, position and
// limits (an HTTP status with the reason when one fails), then opens the
// stream and joins the rooms. HEAD /sse stops before the limits (headSSE).
func (c *conn) openSSE(req *proto.Request) {
	l := c.l
	s := l.srv
	if he := c.identify(req); he != nil {
		c.refuseSSE(he)
		return
	}
	cfg := c.app.cfg.Load()
	switch {
	case cfg == nil:
		c.refuseSSE(errUnknown)
		return
	case cfg.Disabled:
		c.app.refused[RefusedDisabled].Add(1)
		c.refuseSSE(errDisabled)
		return
	}
	if t := cfg.connectProxy; t != nil && !c.proxyOK {
		// The app's backend decides first; its answer reads the request
		// again (proxy.go).
		c.askConnect(t)
		return
	}
	rooms, he := l.sseRooms(req.Query, cfg.maxRooms)
	if he != nil {
		c.refuseSSE(he)
		return
	}
	for _, r := range rooms {
		if c.mayRead(l.sseBuf[r.start:r.end]) != "" {
			c.refuseSSE(errSSEForbidden)
			return
		}
	}
	pos := req.LastEventID
	if len(pos) == 0 {
		// The buffer holds the room names; the position goes after them.
		mark := len(l.sseBuf)
		var ok bool
		l.sseBuf, ok = proto.QueryValue(req.Query, "since", l.sseBuf)
		if !ok && (bytes.HasPrefix(req.Query, []byte("since=")) || bytes.Contains(req.Query, []byte("&since="))) {
			c.refuseSSE(errSSEQuery)
			return
		}
		pos = l.sseBuf[mark:]
	}
	err := proto.ParseSSEPosition(pos, func(room []byte, seq uint64) bool {
		for i := range rooms {
			if bytes.Equal(l.sseBuf[rooms[i].start:rooms[i].end], room) {
				rooms[i].since, rooms[i].hasSince = seq, true
			}
		}
		return true
	})
	if err != nil {
		c.refuseSSE(proto.ErrBadPosition)
		return
	}
	if req.Head {
		c.headSSE()
		return
	}
	au, limited := c.app.admit(cfg, c.user)
	if limited != "" {
		c.refuseSSE(&proto.HTTPError{Status: 429, Reason: limited + ": too many connections of this app or user"})
		return
	}
	out := append(l.scratch[:0], sseHead...)
	if s.nodeHeader != nil {
		out = append(out, s.nodeHeader...) // ends the head with the empty line
	} else {
		out = append(out, "\r\n"...)
	}
	out = append(out, "retry: "...)
	out = strconv.AppendInt(out, int64(s.retryMS()), 10)
	out = append(out, "\n\n"...)
	l.scratch = out[:0]
	if _, err := c.gc.Write(out); err != nil {
		c.app.release(c.user, au)
		return
	}
	_, _ = c.gc.Discard(-1) // a listener sends nothing more that matters
	c.au = au
	c.state = stateOpen
	var endAt int64
	if age := s.cfg.SSEMaxAge.Milliseconds(); age > 0 {
		// Jittered by up to a tenth, so that streams opened together
		// (a node's restart) do not all end together.
		endAt = c.opened + age - rand.Int64N(age/10+1)
	}
	s.Stats.Upgrading.Add(-1)
	s.Stats.SSEConns.Add(1)
	s.Stats.SSEOpened.Add(1)
	c.m.SetSSE(endAt)
	// The user's read positions reach the stream as "event: read".
	c.app.linkWS(c)
	receipts := sseReceipts(req.Query)
	for _, r := range rooms {
		key := l.roomKey(c, l.sseBuf[r.start:r.end])
		c.m.SSEResume(l.intern(key), r.since, r.hasSince) // one string per room for all its listeners
	}
	for _, r := range rooms {
		if c.closed || c.state != stateOpen {
			break
		}
		room := l.sseBuf[r.start:r.end]
		rs := fanout.Resume{Since: r.since, HasSince: r.hasSince}
		if err := l.table.Join(&c.m, l.roomKey(c, room), rs); err != nil {
			// Not expected: the rooms were counted against the limit above.
			c.closeWith(proto.CloseTryAgain, nil)
			break
		}
		if receipts {
			l.table.SetReceipts(&c.m, l.intern(l.roomKey(c, room)), true)
		}
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("sse stream open", "app", c.app.id, "user", c.user, "rooms", len(rooms), "remote", c.clientAddr())
	}
	if !c.closed {
		l.due[c.pos] = c.dueAt()
	}
	l.settle()
	l.kick()
}

// sseReceipts reports whether the query asks the rooms' receipts
// (receipts=true, as a WebSocket join's "receipts":true).
func sseReceipts(query []byte) bool {
	var buf [8]byte
	v, ok := proto.QueryValue(query, "receipts", buf[:0])
	return ok && string(v) == "true"
}

// refuseSSE answers a refused stream. The connection never counted as
// open (OnClose counts it as never upgraded).
func (c *conn) refuseSSE(he *proto.HTTPError) {
	if he == errNoToken {
		he = errSSENoToken
	}
	c.app = nil
	c.refuse(he)
}

// sseRooms decodes the room= parameters of query into l.sseBuf, checks
// their syntax and number, and drops repeats.
func (l *loopState) sseRooms(query []byte, maxRooms int) ([]sseRoom, *proto.HTTPError) {
	l.sseBuf = l.sseBuf[:0]
	rooms := l.sseList[:0]
	for len(query) > 0 {
		pair := query
		if a := bytes.IndexByte(query, '&'); a >= 0 {
			pair, query = query[:a], query[a+1:]
		} else {
			query = nil
		}
		if !bytes.HasPrefix(pair, []byte("room=")) {
			continue
		}
		start := len(l.sseBuf)
		var ok bool
		l.sseBuf, ok = proto.QueryValue(pair, "room", l.sseBuf)
		if !ok {
			return nil, errSSEQuery
		}
		room := l.sseBuf[start:]
		if !proto.ValidRoom(room) {
			return nil, errSSEBadRoom
		}
		dup := false
		for _, r := range rooms {
			if bytes.Equal(l.sseBuf[r.start:r.end], room) {
				dup = true
				break
			}
		}
		if dup {
			l.sseBuf = l.sseBuf[:start]
			continue
		}
		if maxRooms > 0 && len(rooms) >= maxRooms {
			return nil, &proto.HTTPError{Status: 400, Reason: "too many rooms: at most " + strconv.Itoa(maxRooms) + " per connection"}
		}
		rooms = append(rooms, sseRoom{start: start, end: len(l.sseBuf)})
	}
	l.sseList = rooms[:0]
	if len(rooms) == 0 {
		return nil, errSSENoRoom
	}
	return rooms, nil
}

// endSSE ends a stream: what is pending leaves first (unless it was
// dropped: a slow consumer), then a retry field with a jittered delay,
// and the write side is shut behind it, so that the client's EventSource
// reconnects after that delay, here or elsewhere, from its Last-Event-ID.
func (c *conn) endSSE() {
	if c.closed || c.state == stateClosing {
		return
	}
	l := c.l
	if c.m.Out.PendingBytes() > 0 && !c.m.Out.Slow() {
		l.writeOut(c, true)
		if c.closed || c.state == stateClosing {
			return
		}
	}
	l.q.Drop(&c.m.Out)
	out := append(l.scratch[:0], "retry: "...)
	out = strconv.AppendInt(out, int64(l.srv.retryMS()), 10)
	out = append(out, "\n\n"...)
	l.scratch = out[:0]
	_, _ = c.gc.Write(out)
	c.closing()
	c.skip = -1 // anything the client sends is dropped unread
	if !c.closed {
		l.lingerClose(c)
	}
}

// sweepSSE is the sweep of an open stream: token expiry and max age end
// it, and an idle interval without events gets a keep-alive comment.
func (l *loopState) sweepSSE(c *conn, now, idle int64) {
	switch {
	case c.rooms != nil && now >= c.rooms.expMS:
		c.endSSE()
	case c.m.SSEEndAt() > 0 && now >= c.m.SSEEndAt():
		l.srv.Stats.SSEMaxAge.Add(1)
		c.endSSE()
	case now-c.lastRead >= idle:
		// lastRead is the last keep-alive check: a stream never reads.
		c.lastRead = now
		if c.m.SSEQuiet() {
			c.send(ssePing)
		}
	}
}

// sseDueAt is dueAt for an open stream.
func (c *conn) sseDueAt() int64 {
	d := c.lastRead + c.l.srv.cfg.IdleInterval.Milliseconds()
	if e := c.m.SSEEndAt(); e > 0 && e < d {
		d = e
	}
	if c.rooms != nil && c.rooms.expMS < d {
		d = c.rooms.expMS
	}
	return d
}

// sseEnd ends every self-contained piece of a stream (an event with its id
// line, a keep-alive): the blank line that dispatches it.
var sseEnd = []byte("\n\n")
