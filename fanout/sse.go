package fanout

import (
	"strconv"

	"github.com/roost-chat/roost/proto"
)

// An SSE member receives the room's messages as Server-Sent Events rather
// than WebSocket frames. The event of a message ("event: msg", "data:" the
// frame's JSON) is built once per message for the node, by the hub, from
// the shared frame, and shared by every SSE member like the frame; it is
// not built at all for a room without SSE members. Only a member of
// several rooms has bytes of its own: the id line after each event, its
// position in every room, written into a buffer the member reuses, so
// steady delivery allocates nothing.

// ssePos is an SSE member's position in one of its rooms: the newest seq
// it has been sent there (has: known; a room not joined yet and not
// resumed is left out of the id).
type ssePos struct {
	key  string
	room string // key's room part, as the id names it
	seq  uint64
	has  bool
}

// sseMember is the SSE side of a Member.
type sseMember struct {
	pos []ssePos // in the order the client named the rooms
	// ids holds the id lines of the pending events; pending slices point
	// into it, so it is reset only once nothing is pending (resetIDs).
	ids []byte
	// events counts the events queued, seen its value at the last
	// Quiet: the loop's keep-alive tells a stream with events from an
	// idle one.
	events, seen uint64
	// endAt is when the loop ends the stream (Unix ms; 0: never).
	endAt int64
}

// maxIDBuf is the id buffer an SSE member keeps between flushes; a bigger
// one (a burst) is given back.
const maxIDBuf = 16 << 10

// SetSSE makes m an SSE member (before any join): the table sends it
// events, not frames. endAt is the loop's: when the stream is to end
// (Unix ms; 0: never), kept here so that a WebSocket connection pays
// nothing for it. Loop only.
func (m *Member) SetSSE(endAt int64) { m.sse = &sseMember{endAt: endAt} }

// SSE reports whether m is an SSE member.
func (m *Member) SSE() bool { return m.sse != nil }

// SSEEndAt is the endAt given to SetSSE.
func (m *Member) SSEEndAt() int64 { return m.sse.endAt }

// SSEQuiet reports whether no event was queued for the SSE member m since
// the previous call. Loop only.
func (m *Member) SSEQuiet() bool {
	s := m.sse
	quiet := s.events == s.seen
	s.seen = s.events
	if m.Out.PendingBytes() == 0 {
		s.resetIDs()
	}
	return quiet
}

// SSEResume records the position a resuming SSE client sent for the room
// key (its join carries since=seq): until the room says otherwise, that is
// where the member stands. Call before Join, in the order of the rooms.
// Loop only.
func (m *Member) SSEResume(key string, seq uint64, has bool) {
	_, room := proto.SplitKey(key)
	m.sse.pos = append(m.sse.pos, ssePos{key: key, room: room, seq: seq, has: has})
}

func (s *sseMember) set(key string, seq uint64) {
	for i := range s.pos {
		if s.pos[i].key == key {
			s.pos[i].seq, s.pos[i].has = seq, true
			return
		}
	}
}

// appendID appends the id line of the member's current position and the
// blank line that dispatches the event before it.
func (s *sseMember) appendID(dst []byte) []byte {
	dst = append(dst, "id: "...)
	first := true
	for i := range s.pos {
		p := &s.pos[i]
		if !p.has {
			continue
		}
		dst = proto.AppendSSEPositionItem(dst, first, p.room, p.seq)
		first = false
	}
	return append(dst, "\n\n"...)
}

// sseEvent builds the shared event of a message frame.
//
// The event is built with the id line of a member of this room alone
// ("id: room:seq"), which is every such member's position: they all take
// the whole event, one slice, as WebSocket members take the frame. A
// member of several rooms takes the event's first evLen bytes (without
// that line) and its own id line after them.
//
// The hub builds it for messages from the broker, once for the whole node
// (Event.sse); a loop builds its own only for what it delivers otherwise
// (held, read from the store) or when the hub did not know of its SSE
// members yet.
func (t *Table) sseEvent(r *Room, seq uint64, frame []byte) (event []byte, evLen int) {
	event = buildSSEEvent(t.arena, r.key, seq, frame)
	return event, len(event) - sseIDLen(r, seq)
}

// buildSSEEvent builds the event of the message frame of room key in a.
func buildSSEEvent(a *Arena, key string, seq uint64, frame []byte) []byte {
	payload, _ := proto.ServerFramePayload(frame)
	room := roomName(key)
	b := a.Space(proto.SSEEventLen("msg", len(payload), 0) + len("id: :\n\n") + len(room) + 20)
	b = proto.AppendSSEEvent(b, "msg", payload)
	b = append(b, "id: "...)
	b = append(b, room...)
	b = append(b, ':')
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, "\n\n"...)
	return a.Keep(b)
}

// sseIDLen is the length of the id line an event of r's seq ends with.
func sseIDLen(r *Room, seq uint64) int {
	n := 1
	for v := seq; v >= 10; v /= 10 {
		n++
	}
	_, room := proto.SplitKey(r.key)
	return len("id: :\n\n") + len(room) + n
}

// enqueueSSE queues a message's shared event for an SSE member with its
// id line. Under the outbound limit like any live message.
func (t *Table) enqueueSSE(m *Member, r *Room, seq uint64, event []byte, evLen int) {
	o := &m.Out
	if o.Slow() || o.Closed() {
		return
	}
	s := m.sse
	s.set(r.key, seq)
	if len(s.pos) == 1 {
		// Fast path: in this room only, its position is the event's own id.
		s.events++
		t.q.Enqueue(o, event)
		return
	}
	if o.PendingBytes() == 0 {
		s.resetIDs() // nothing pending points into it any more
	}
	event = event[:evLen:evLen]
	start := len(s.ids)
	s.ids = s.appendID(s.ids)
	id := s.ids[start:len(s.ids):len(s.ids)]
	if !t.q.Fits(o, len(event)+len(id)) {
		s.ids = s.ids[:start]
		t.q.MarkSlow(o)
		return
	}
	s.events++
	t.q.Push(o, event)
	t.q.Push(o, id)
}

// resetIDs empties the id buffer, giving back one a burst made big. Only
// once nothing pending points into it: the outbound queue, which the loop
// flushes, does not know of it, so the member looks before it appends
// (enqueueSSE) and at its keep-alive (SSEQuiet).
func (s *sseMember) resetIDs() {
	s.ids = s.ids[:0]
	if cap(s.ids) > maxIDBuf {
		s.ids = nil
	}
}

// sseFrames turns frames the table built for one SSE member (joined, err,
// a replay page of msg frames) into events, each with the id line of the
// member's position after it, in one buffer of the member's own. Not the
// delivery path: joins and catch-ups only.
func (t *Table) sseFrames(m *Member, r *Room, frames []byte, jf *proto.Joined) []byte {
	s := m.sse
	a := t.arena
	size := 0
	for b := frames; len(b) > 0; {
		p, n := proto.ServerFramePayload(b)
		if n == 0 {
			break
		}
		size += proto.SSEEventLen("presence_diff", len(p), 0) + 32 + 64*len(s.pos)
		b = b[n:]
	}
	out := a.Space(size)
	for b := frames; len(b) > 0; {
		p, n := proto.ServerFramePayload(b)
		if n == 0 {
			break
		}
		b = b[n:]
		op := proto.FrameOp(p)
		if op == "" {
			continue
		}
		out = proto.AppendSSEEvent(out, op, p)
		switch {
		case op == "msg" && r != nil:
			if seq, ok := proto.MsgSeq(p); ok {
				s.set(r.key, seq)
			}
		case op == "joined" && r != nil && jf != nil:
			switch {
			case !jf.Resumed:
				s.set(r.key, jf.Seq)
			case !jf.Recovered:
				s.set(r.key, jf.From-1)
			default:
				// Everything after the client's since follows: it stays
				// where it said it was until the replay moves it on.
			}
		case op == "err":
			out = append(out, '\n')
			continue
		}
		s.events++
		out = s.appendID(out)
	}
	return a.Keep(out)
}
