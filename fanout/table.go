package fanout

import "github.com/roost-chat/roost/fanout/outq"

// Owner is the connection behind a Member, as its loop's table reaches it.
// Both methods run on the member's loop.
type Owner interface {
	// Write hands the member's pending frames to the transport.
	Write()
	// Resync closes the connection with 1013 and a retry hint: its stream
	// of a room cannot continue here without a gap, and the client rejoins
	// with since.
	Resync()
	// User is the connection's user id, as presence counts it; the same
	// for the connection's life.
	User() string
	// Buffered is what the transport still holds of earlier writes: with
	// the member's pending bytes, what has not left for the client yet.
	// Replays read their next page only once that is under a page.
	Buffered() int
}

// Member is a connection's side of fan-out: its live room memberships and
// its joins on the way. Its output goes to its Out, the connection's
// outbound queue, which the loop holds beside the Member and the loop's
// outq.Queue owns. Every field is owned by the member's loop.
type Member struct {
	// Out is the connection's outbound queue, in the Member rather than
	// pointed to (the connection stays in its size class,
	// TestConnStateSmall); its Owner, the connection, is set once by the
	// loop before any join.
	Out   outq.Out[Owner]
	slots []slot
	// joins: its joins on the way, a list through joinState.next (a
	// pointer, not a slice: the connection stays in its size class,
	// TestConnStateSmall).
	joins *joinState
	sse   *sseMember  // nil for a WebSocket member
	chat  *memberChat // its user, signal, echo, receipts and store reads state; nil until first needed
}

// memberChat is what a WebSocket member holds for chat state, apart so
// that the connection's own state stays small.
//
// It is made on the member's first signal, read mark, receipts request,
// echo-off join or store read (history, presence, catch-up), never for an
// idle connection (TestIdleConnNoChatState):
// which connections a user's read positions reach is the loop's index
// (SetUsers), not a field here.
type memberChat struct {
	sig uint64 // its sender tag for signals and read marks (signal.go)
	// SignalTAT is the connection's signal bucket (its theoretical
	// arrival time), the loop's to spend.
	SignalTAT int64
	// ReadTAT is its bucket for read, unread and receipts requests, which
	// share one queue per node: one client's flood must not fill it.
	ReadTAT  int64
	receipts []string // keys of the rooms it gets receipts of
	own      *ownPubs // its echo-off rooms and publishes in them (echo.go); nil: none
	// reads: its store reads (history, presence, catch-up); nil until it
	// makes one. Here rather than in Member, so that the connection stays
	// in its size class (TestConnStateSmall). Set once, on the loop, before
	// the first read job leaves for a reader.
	reads *readQueue
}

// readQ is m's store reads, nil if it never made one. On a reader
// goroutine only for a member whose read job it holds (the fields were
// set before the job was sent, and never change after).
func (m *Member) readQ() *readQueue {
	if m.chat == nil {
		return nil
	}
	return m.chat.reads
}

type slot struct {
	room  *Room
	pos   int32
	watch bool // a presence subscriber of room
}

// Rooms is the number of rooms m is a live member of.
func (m *Member) Rooms() int { return len(m.slots) }

// Joining is the number of m's joins not yet live.
func (m *Member) Joining() (n int) {
	for j := m.joins; j != nil; j = j.next {
		n++
	}
	return n
}

// in reports whether m is a live member of r.
func (m *Member) in(r *Room) bool {
	for i := range m.slots {
		if m.slots[i].room == r {
			return true
		}
	}
	return false
}

// Table is one loop's rooms and what their members are owed (replays,
// store reads); their output goes to the loop's outbound queue (Queue). Not safe for concurrent use:
// it belongs to its loop.
type Table struct {
	node  *Node // nil for a bare table (delivery only)
	idx   int   // the loop's index
	loop  Loop
	arena *Arena

	rooms map[string]*Room
	q     *outq.Queue[Owner] // the loop's outbound queue: members' output goes there

	gaps []*Room // rooms holding messages behind a missing seq
	// tails are rooms whose newest messages must be read from the store
	// because the broker may have lost some (reset). At most maxTailReads
	// are read at once, so that a loop with thousands of rooms does not
	// overflow the shared read queue; a failed read is queued again after
	// GapWindow (tailRetry) rather than forgotten.
	tails       []*Room
	tailWant    map[*Room]bool
	tailReads   int
	tailRetry   []*Room
	tailRetryAt int64
	// tailPaced are rooms whose tail repair stopped at its bounds and
	// whose next step waits for the members to take the last (pumpTails).
	tailPaced []*Room

	paced []*Member // members whose next store read waits for their output to leave (pump)

	// usersOf lists a user's members on this loop ("app/user"), from the
	// loop's own per-user records (SetUsers): a connection costs no entry
	// in a per-loop map of users here. nil: no user frames (tests).
	usersOf  func(userKey string, dst []*Member) []*Member
	userBuf  []*Member            // usersOf's answer, reused
	receipts map[string][]*Member // room key -> its receipts subscribers on this loop

	// posSoon (SetPositionsSoon) has the loop call FlushPositions at the
	// end of its current wake-up; posOut are the read marks, unread and
	// receipts requests gathered until then. nil: each goes at once.
	posSoon func()
	posOut  []posJob

	// answered are the queues of members that got the answer to a request
	// of theirs (history, presence, read, unread, receipts) since the
	// loop last took them (TakeAnswered): a client waiting on an answer
	// should not wait for the next flush tick as well. At most maxAnswered.
	answered []*outq.Out[Owner]
}

// maxAnswered bounds Table.answered: past it an answer leaves with the
// next tick, as any frame.
const maxAnswered = 4096

// answer records that m got the answer to a request of its own.
func (t *Table) answer(m *Member) {
	if len(t.answered) < maxAnswered {
		t.answered = append(t.answered, &m.Out)
	}
}

// Answered returns the queues of members answered since the last
// ClearAnswered, for the loop to write at the end of its wake-up. Loop only.
func (t *Table) Answered() []*outq.Out[Owner] { return t.answered }

// ClearAnswered forgets the queues Answered returned. Loop only.
func (t *Table) ClearAnswered() {
	clear(t.answered)
	t.answered = t.answered[:0]
}

// newTable returns an empty table. limit is the outbound limit per member
// (pending + transport backlog); flushAt is the pending size past which a
// member is flushed at once rather than at the next tick.
func newTable(limit, flushAt int) *Table {
	return &Table{rooms: make(map[string]*Room), q: outq.New[Owner](limit, flushAt), arena: NewArena(64 << 10)}
}

// Queue is the loop's outbound queue, which the table fills and the
// loop's flush drains.
func (t *Table) Queue() *outq.Queue[Owner] { return t.q }

// Arena is the loop's arena for the small frames it builds (acks, errs,
// pongs); the table builds its own (joined, err) in it too.
func (t *Table) Arena() *Arena { return t.arena }

// lookup finds a room by key without allocating.
func (t *Table) lookup(key []byte) *Room { return t.rooms[string(key)] }

// add creates a room (not yet active). The key is copied.
func (t *Table) add(key []byte) *Room {
	r := &Room{key: string(key)}
	t.rooms[r.key] = r
	return r
}

// remove drops an empty room from the table.
func (t *Table) remove(r *Room) {
	if len(r.members) != 0 {
		panic("BUG: fanout: removing a room with members")
	}
	if t.rooms[r.key] == r {
		delete(t.rooms, r.key)
	}
}

// Len is the number of rooms on this loop.
func (t *Table) Len() int { return len(t.rooms) }

// join makes m a live member of r: it gets every frame delivered to r from
// now on.
func (t *Table) join(r *Room, m *Member) {
	m.slots = append(m.slots, slot{room: r, pos: int32(len(r.members))})
	r.members = append(r.members, m)
	if m.sse != nil && t.node != nil {
		t.node.hub.sseMembers(r.key, 1) // so that the hub builds its events
	}
}

// leave removes m from r and reports whether r has no live members left.
// Safe during a delivery to another room, not during fan to r itself
// (nothing closes a connection inside fan).
func (t *Table) leave(r *Room, m *Member) (empty bool) {
	for i := range m.slots {
		if m.slots[i].room != r {
			continue
		}
		pos := m.slots[i].pos
		if t.node != nil {
			t.node.pres.leave(r.key, m.Out.Owner.User(), m.slots[i].watch, t.loop.Now())
			if m.slots[i].watch {
				r.unwatch(m)
			}
		}
		last := len(r.members) - 1
		moved := r.members[last]
		r.members[pos] = moved
		r.members[last] = nil
		r.members = r.members[:last]
		if moved != m {
			for j := range moved.slots {
				if moved.slots[j].room == r {
					moved.slots[j].pos = pos
					break
				}
			}
		}
		m.slots[i] = m.slots[len(m.slots)-1]
		m.slots = m.slots[:len(m.slots)-1]
		if m.sse != nil && t.node != nil {
			t.node.hub.sseMembers(r.key, -1)
		}
		break
	}
	if len(r.members) == 0 && cap(r.members) > 64 {
		r.members = nil // a room that emptied gives back its big slice
	}
	return len(r.members) == 0
}

// joinLive makes m a live member of r, counted by presence; with watch,
// it gets r's presence_diff frames too.
func (t *Table) joinLive(r *Room, m *Member, watch bool) {
	t.join(r, m)
	t.node.Stats.Joined.Add(1)
	t.node.pres.join(r.key, m.Out.Owner.User(), watch)
	if watch {
		m.slots[len(m.slots)-1].watch = true
		r.watchers = append(r.watchers, m)
	}
}

// leaveAll removes m from every room, dropping each room it leaves idle.
func (t *Table) leaveAll(m *Member) {
	for len(m.slots) > 0 {
		r := m.slots[len(m.slots)-1].room
		if t.leave(r, m) {
			t.removeIfIdle(r)
		}
	}
	m.slots = nil
}

// fan queues frame for every live member of r. The frame is shared, not
// copied. Members that pass the outbound limit are marked slow and
// collected for CloseSlow; nothing is dropped silently.
//
// Fast path: one append of a slice header per member; no allocation once
// the freelists are warm. SSE members share one event, built only when
// the room has one (sse.go).
func (t *Table) fan(r *Room, seq uint64, frame, event []byte) {
	evLen := 0
	if event != nil {
		evLen = len(event) - sseIDLen(r, seq)
	}
	for _, m := range r.members {
		// Echo off: gated by the room's count, so that a room without
		// such members pays nothing per member.
		if r.noEcho > 0 && m.chat != nil && m.chat.own != nil && m.chat.own.skip(r, seq, frame, m.Out.Owner.User()) {
			continue
		}
		if m.sse == nil {
			t.q.Enqueue(&m.Out, frame)
			continue
		}
		if event == nil {
			event, evLen = t.sseEvent(r, seq, frame)
		}
		t.enqueueSSE(m, r, seq, event, evLen)
	}
}

// enqueue queues one frame for one member (an ack, a joined, a message)
// under the outbound limit.
func (t *Table) enqueue(m *Member, frame []byte) { t.q.Enqueue(&m.Out, frame) }

// enqueueReplay queues a page of a replay (catch-up, history answer)
// without the outbound limit: a replay's next page is read only once the
// previous one has left (pump), so what a replay adds is bounded by its
// page size, and a replay never makes a client a slow consumer. The limit
// judges live messages only.
func (t *Table) enqueueReplay(m *Member, r *Room, frame []byte) {
	if m.Out.Slow() || m.Out.Closed() {
		return
	}
	if m.sse != nil {
		frame = t.sseFrames(m, r, frame, nil)
	}
	t.q.Push(&m.Out, frame)
}

// CloseSlow closes the members that passed the outbound limit: what they
// could not take is dropped, and they are closed with 1013 and a retry
// hint (Owner.Resync).
func (t *Table) CloseSlow() {
	for t.q.HasSlow() { // a close may mark another member slow
		for _, o := range t.q.TakeSlow() {
			if o.Closed() {
				continue
			}
			if t.node != nil {
				t.node.Stats.SlowCloses.Add(1)
			}
			t.q.Drop(o)
			o.Owner.Resync()
		}
	}
}

// NeedsTick reports whether the next flush tick has work for the table: a
// held gap or a failed tail read waiting for its window (checked at each
// tick, or a quiet room would wait for the next sweep), or a replay
// waiting for its member's output to leave. Pending output is the
// Queue's (HasDirty).
func (t *Table) NeedsTick() bool {
	return len(t.gaps) > 0 || len(t.tailRetry) > 0 || len(t.paced) > 0 || len(t.tailPaced) > 0
}

// ChatState reports whether m's chat state (memberChat) has been made:
// never for a connection that only joined rooms (loop's
// TestIdleConnNoChatState holds the density to it).
func (m *Member) ChatState() bool { return m.chat != nil }
