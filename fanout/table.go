package fanout

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

// Member is a connection's side of fan-out: its live room memberships, its
// joins on the way, and its pending output. The loop embeds one in each
// connection; every field is owned by that loop.
type Member struct {
	// Owner is the connection (set once by the loop, before any join).
	Owner Owner
	// pending holds references to immutable frames, in send order. It is
	// borrowed from the Table's freelists only while non-empty, so an idle
	// connection holds no buffer.
	pending [][]byte
	bytes   int // sum of len(pending[i])
	// Backlog is what the transport still holds from earlier flushes
	// (gnet's outbound buffer); the loop refreshes it after every write. It
	// counts against the outbound limit so a consumer that stopped reading
	// is caught even when each flush is small.
	Backlog int
	slots   []slot
	joins   []*joinState
	reads   *readQueue // its store reads; nil until it makes one
	sse     *sseMember // nil for a WebSocket member
	dirty   bool
	urgent  bool
	// slow is set once the member passed the outbound limit: nothing more
	// is queued for it and CloseSlow has it closed with 1013.
	slow bool
	// Closed is set by the loop once the connection is closing or gone;
	// nothing more is queued for it and queued work for it is skipped.
	Closed bool
	// Parked is the loop's: the member's frames wait for the transport to
	// drain what the kernel refused (Sent).
	Parked bool
	// wrote is the flush period (NewPeriod) of the member's last write
	// (Sent). 16 bits keep Member, and the loop's connection around it, in
	// its size budget; a member last written exactly 65,536 periods ago
	// only waits for the next tick.
	wrote uint16
}

type slot struct {
	room  *Room
	pos   int32
	watch bool // a presence subscriber of room
}

// Pending returns the frames queued for m, oldest first. Loop only; valid
// until Flushed.
func (m *Member) Pending() [][]byte { return m.pending }

// PendingBytes is the size of what is queued for m.
func (m *Member) PendingBytes() int { return m.bytes }

// Slow reports whether m passed the outbound limit.
func (m *Member) Slow() bool { return m.slow }

// Rooms is the number of rooms m is a live member of.
func (m *Member) Rooms() int { return len(m.slots) }

// Joining is the number of m's joins not yet live.
func (m *Member) Joining() int { return len(m.joins) }

// in reports whether m is a live member of r.
func (m *Member) in(r *Room) bool {
	for i := range m.slots {
		if m.slots[i].room == r {
			return true
		}
	}
	return false
}

// Table is one loop's rooms and pending output. Not safe for concurrent use:
// it belongs to its loop.
type Table struct {
	node  *Node // nil for a bare table (delivery only)
	idx   int   // the loop's index
	loop  Loop
	arena *Arena

	rooms  map[string]*Room
	dirty  []*Member
	urgent []*Member
	// fresh: members that got output while not yet written in the current
	// flush period (the loop's tick), the ones the loop may write before
	// the tick without a second write in one period.
	fresh   []*Member
	spareFr []*Member // TakeFresh's other list
	period  uint16
	slow    []*Member
	limit   int // outbound limit per member, bytes
	flushAt int // pending bytes that make a member worth flushing before the tick
	free    [len(classes)][][][]byte
	// unused: per class, the fewest lists its freelist held since the last
	// TrimFree, i.e. lists that no take reached in that time.
	unused [len(classes)]int

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
}

// pending-list size classes: a connection that gets a frame every few
// hundred ms (a chat: most connections) has one frame per write nearly
// always, and holds 24 bytes of list while it waits rather than 192; most
// other flushes carry a handful of frames; a busy room at 8,000 msg/s and a
// 4 ms tick gives ~32, at 15,000-30,000 msg/s 60-120 and more when a tick
// is stretched; the largest class covers a catch-up burst until flushAt
// forces a write. Above 64 the classes double: a busy member takes a list
// near its need (3 or 6 KB, not 12).
var classes = [...]int{1, 8, 64, 128, 256, 512, 4096}

// maxFreeBytes bounds each freelist, in bytes of list (24 per frame
// reference), so that a backlog does not pin memory after it has left: a
// burst that took thousands of 4096-frame lists keeps 42 of them, not a
// thousand (96 MB), and all the freelists of a loop keep at most 28 MiB
// of lists, plus 4.6 MiB of the slice headers that hold them (24 bytes a
// list: 174,762 one-frame lists alone take 4 MiB of headers).
// The bound is also what steady high-rate delivery needs: every member of
// a busy room takes its list again at the next tick, and a list dropped at
// a write because its freelist was full is allocated again then (a room
// of 330 at 19,000 msg/s, with 512-frame lists kept to 64, allocated 3 MB
// per tick). Each class up to 512 keeps a list for every member of a room
// of 330 on one loop, up to 512 frames per write (~120,000 msg/s at a 4 ms
// tick, or a node so busy that its ticks stretch), and the small ones keep
// enough for every member of a loop at once (174,762 single-frame lists):
// a commit batch that makes thousands of members dirty in one wake-up
// takes its lists from the freelist, not from the heap.
const maxFreeBytes = 4 << 20

// maxFree is how many lists of each class its freelist keeps.
var maxFree = func() (n [len(classes)]int) {
	for i, size := range classes {
		n[i] = maxFreeBytes / (size * 24)
	}
	return n
}()

// newTable returns an empty table. limit is the outbound limit per member
// (pending + transport backlog); flushAt is the pending size past which a
// member is flushed at once rather than at the next tick.
func newTable(limit, flushAt int) *Table {
	// period 1: a member's zero wrote is no period (never written).
	return &Table{rooms: make(map[string]*Room), limit: limit, flushAt: flushAt, arena: NewArena(64 << 10), period: 1}
}

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
			t.node.pres.leave(r.key, m.Owner.User(), m.slots[i].watch, t.loop.Now())
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
	t.node.pres.join(r.key, m.Owner.User(), watch)
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
		if m.sse == nil {
			t.Enqueue(m, frame)
			continue
		}
		if event == nil {
			event, evLen = t.sseEvent(r, seq, frame)
		}
		t.enqueueSSE(m, r, seq, event, evLen)
	}
}

// Enqueue queues one frame for one member (an ack, a joined, a message).
func (t *Table) Enqueue(m *Member, frame []byte) {
	if m.slow || m.Closed {
		return
	}
	if m.bytes+m.Backlog+len(frame) > t.limit {
		m.slow = true
		t.slow = append(t.slow, m)
		return
	}
	t.queue(m, frame)
}

// enqueueReplay queues a page of a replay (catch-up, history answer)
// without the outbound limit: a replay's next page is read only once the
// previous one has left (pump), so what a replay adds is bounded by its
// page size, and a replay never makes a client a slow consumer. The limit
// judges live messages only.
func (t *Table) enqueueReplay(m *Member, r *Room, frame []byte) {
	if m.slow || m.Closed {
		return
	}
	if m.sse != nil {
		frame = t.sseFrames(m, r, frame, nil)
	}
	t.queue(m, frame)
}

func (t *Table) queue(m *Member, frame []byte) {
	n := len(frame)
	if len(m.pending) == cap(m.pending) {
		t.grow(m)
	}
	m.pending = append(m.pending, frame)
	m.bytes += n
	if !m.dirty {
		m.dirty = true
		t.dirty = append(t.dirty, m)
		if m.wrote != t.period {
			t.fresh = append(t.fresh, m)
		}
	}
	if m.bytes >= t.flushAt && !m.urgent {
		m.urgent = true
		t.urgent = append(t.urgent, m)
	}
}

func (t *Table) grow(m *Member) {
	c := cap(m.pending)
	next := -1
	for i, size := range classes {
		if size > c {
			next = i
			break
		}
	}
	var nb [][]byte
	if next < 0 {
		nb = make([][]byte, 0, 2*c) // beyond the largest class: rare, not pooled
	} else {
		nb = t.get(next)
	}
	nb = append(nb, m.pending...)
	t.put(m.pending)
	m.pending = nb
}

func (t *Table) get(class int) [][]byte {
	fl := t.free[class]
	if n := len(fl); n > 0 {
		b := fl[n-1]
		fl[n-1] = nil
		t.free[class] = fl[:n-1]
		if n-1 < t.unused[class] {
			t.unused[class] = n - 1
		}
		return b
	}
	return make([][]byte, 0, classes[class])
}

// TrimFree gives back half of each freelist's lists that no take reached
// since the last call. maxFreeBytes lets a backlog leave up to 28 MiB of
// lists behind a loop; without a trim they stay for the life of the
// process (a node of 16,700 chat connections kept 8.7 MB of lists after a
// backlog of 1-2 s, as much as the connections' own state). A freelist
// that steady delivery draws from every tick keeps all it uses; a
// backlog's lists are gone within seconds of its end. Call it about once
// a second (the loop's sweep).
func (t *Table) TrimFree() {
	for i := range t.free {
		fl := t.free[i]
		if drop := (t.unused[i] + 1) / 2; drop > 0 {
			n := len(fl) - drop
			clear(fl[n:])
			fl = fl[:n]
			// The slice holding the lists costs 24 bytes a list itself.
			if cap(fl) > 64 && cap(fl) > 4*len(fl) {
				fl = append(make([][][]byte, 0, 2*len(fl)), fl...)
			}
			t.free[i] = fl
		}
		t.unused[i] = len(t.free[i])
	}
}

func (t *Table) put(b [][]byte) {
	if cap(b) == 0 {
		return
	}
	// Drop frame references so their chunks can be freed. Only [:len] can
	// hold any: every list is cleared this way when it comes back, so the
	// slots past len are still clear from its last return (clearing the
	// whole capacity cost 3% of the loop at 8,000 msg/s).
	clear(b)
	for i, size := range classes {
		if cap(b) == size {
			if len(t.free[i]) < maxFree[i] {
				t.free[i] = append(t.free[i], b[:0])
			}
			return
		}
	}
}

// Flushed tells the table that m's pending frames were handed to the
// transport (written or buffered by it). The pending list goes back to the
// freelist: an idle member holds none.
func (t *Table) Flushed(m *Member) {
	if s := m.sse; s != nil {
		s.ids = s.ids[:0] // nothing pending points into it any more
		if cap(s.ids) > maxIDBuf {
			s.ids = nil
		}
	}
	t.put(m.pending)
	m.pending = nil
	m.bytes = 0
	m.dirty = false
	m.urgent = false
}

// Sent tells the table that the first n of m's pending frames were handed
// to the transport; the rest stay queued, in order, for a later write: the
// kernel refused them, and the loop keeps them here rather than copying
// them into the transport, so a slow consumer's backlog costs references to
// shared frames, and dropping it (a slow consumer's close) cuts no frame.
// m is not dirty afterwards: the loop writes it again once the transport
// has drained.
func (t *Table) Sent(m *Member, n int) {
	m.wrote = t.period
	if n >= len(m.pending) {
		t.Flushed(m)
		return
	}
	rest := copy(m.pending, m.pending[n:])
	clear(m.pending[rest:])
	m.pending = m.pending[:rest]
	m.bytes = 0
	for _, f := range m.pending {
		m.bytes += len(f)
	}
	m.dirty = false
	m.urgent = false
}

// Drop discards m's pending output (the connection is gone or is being
// closed as a slow consumer).
func (t *Table) Drop(m *Member) {
	t.Flushed(m)
}

// TakeDirty returns the members with pending output and resets the list.
// The returned slice is valid until the next TakeDirty.
func (t *Table) TakeDirty() []*Member {
	d := t.dirty
	t.dirty = t.dirty[:0]
	t.urgent = t.urgent[:0]
	t.fresh = t.fresh[:0]
	return d
}

// NewPeriod starts a flush period: the loop calls it at each flush tick,
// and a member written (Sent) since belongs to it.
func (t *Table) NewPeriod() {
	t.period++
	t.fresh = t.fresh[:0]
}

// TakeFresh returns the members that got output since the last TakeFresh
// or TakeDirty and had not been written in the current period when they
// did; one written in between is there with nothing pending or with a
// write in this period (WroteInPeriod). Valid until the next TakeFresh.
func (t *Table) TakeFresh() []*Member {
	f := t.fresh
	t.fresh, t.spareFr = t.spareFr[:0], f
	return f
}

// WroteInPeriod reports whether m was written in the current period.
func (t *Table) WroteInPeriod(m *Member) bool { return m.wrote == t.period }

// TakeUrgent returns members whose pending output passed flushAt, to be
// flushed before the tick (bounds the work and memory of one wake-up).
func (t *Table) TakeUrgent() []*Member {
	u := t.urgent
	t.urgent = t.urgent[:0]
	return u
}

// HasDirty reports whether anything waits for a flush.
func (t *Table) HasDirty() bool { return len(t.dirty) > 0 }

// HasSlow reports whether a member passed the outbound limit since the last
// CloseSlow.
func (t *Table) HasSlow() bool { return len(t.slow) > 0 }

// CloseSlow closes the members that passed the outbound limit: what they
// could not take is dropped, and they are closed with 1013 and a retry
// hint (Owner.Resync).
func (t *Table) CloseSlow() {
	for i := 0; i < len(t.slow); i++ { // a close may mark another member slow
		m := t.slow[i]
		if m.Closed {
			continue
		}
		if t.node != nil {
			t.node.Stats.SlowCloses.Add(1)
		}
		t.Drop(m)
		m.Owner.Resync()
	}
	clear(t.slow)
	t.slow = t.slow[:0]
}

// NeedsTick reports whether the next flush tick has work: pending output,
// a held gap or a failed tail read waiting for its window (checked at each
// tick, or a quiet room would wait for the next sweep), or a replay waiting
// for its member's output to leave.
func (t *Table) NeedsTick() bool {
	return len(t.dirty) > 0 || len(t.gaps) > 0 || len(t.tailRetry) > 0 || len(t.paced) > 0 || len(t.tailPaced) > 0
}
