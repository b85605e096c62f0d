package fanout

// Member is a connection's side of fan-out: its live room memberships and
// its pending output. The loop embeds one in each connection; every field is
// owned by that loop.
type Member struct {
	// Owner points back at the loop's connection struct.
	Owner any
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
	dirty   bool
	urgent  bool
	// Slow is set once the member passed the outbound limit: nothing more is
	// queued for it and the loop closes it with 1013.
	Slow bool
	// Closed is set by the loop when the connection is gone; queued work
	// for it is skipped.
	Closed bool
}

type slot struct {
	room *Room
	pos  int32
}

// Pending returns the frames queued for m, oldest first. Loop only; valid
// until Flushed.
func (m *Member) Pending() [][]byte { return m.pending }

// PendingBytes is the size of what is queued for m.
func (m *Member) PendingBytes() int { return m.bytes }

// Rooms is the number of rooms m is a live member of.
func (m *Member) Rooms() int { return len(m.slots) }

// In reports whether m is a live member of r.
func (m *Member) In(r *Room) bool {
	for i := range m.slots {
		if m.slots[i].room == r {
			return true
		}
	}
	return false
}

// Room is one room as seen by one loop: its live members and the newest seq
// the loop delivered. The loop that owns the Table owns every field.
type Room struct {
	Key     string
	members []*Member
	// Last is the newest seq delivered to this loop's members (or the
	// room's newest committed seq when it became active): a member that
	// joins now starts after Last.
	Last uint64
	// Active is false until the broker subscription is up and Last is
	// known; deliveries meanwhile wait in Held.
	Active bool
	// Held are deliveries that cannot go out yet: they arrived before the
	// room was active, or ahead of a missing seq. Kept sorted by seq.
	Held []Held
	// GapSince is the loop's clock (ms) when the oldest gap was first seen;
	// 0 when there is none.
	GapSince int64
	// Repairing is set while a store read for a gap is in flight.
	Repairing bool
	// Joiners are members whose join waits for the room to become active
	// or for their catch-up to reach Last; a room is removed only when it
	// has no live members and no joiners.
	Joiners []*Member
}

// Idle reports whether the room can be dropped from its table.
func (r *Room) Idle() bool { return len(r.members) == 0 && len(r.Joiners) == 0 }

// RemoveJoiner forgets m as a joiner of r.
func (r *Room) RemoveJoiner(m *Member) {
	for i, j := range r.Joiners {
		if j == m {
			last := len(r.Joiners) - 1
			r.Joiners[i] = r.Joiners[last]
			r.Joiners[last] = nil
			r.Joiners = r.Joiners[:last]
			return
		}
	}
}

// Held is a delivery that waits for its turn.
type Held struct {
	Seq   uint64
	Frame []byte
}

// Members is the number of live members.
func (r *Room) Members() int { return len(r.members) }

// Table is one loop's rooms and pending output. Not safe for concurrent use:
// it belongs to its loop.
type Table struct {
	rooms   map[string]*Room
	dirty   []*Member
	urgent  []*Member
	slow    []*Member
	limit   int // outbound limit per member, bytes
	flushAt int // pending bytes that make a member worth flushing before the tick
	free    [len(classes)][][][]byte
}

// pending-list size classes: most flushes carry a handful of frames; a busy
// room at 8,000 msg/s and a 4 ms tick gives ~32; the largest class covers a
// catch-up burst until flushAt forces a write.
var classes = [...]int{8, 64, 512, 4096}

// maxFree bounds each freelist so a burst does not pin memory forever.
const maxFree = 1024

// NewTable returns an empty table. limit is the outbound limit per member
// (pending + transport backlog); flushAt is the pending size past which a
// member is flushed at once rather than at the next tick.
func NewTable(limit, flushAt int) *Table {
	return &Table{rooms: make(map[string]*Room), limit: limit, flushAt: flushAt}
}

// Lookup finds a room by key without allocating.
func (t *Table) Lookup(key []byte) *Room { return t.rooms[string(key)] }

// Get finds a room by key.
func (t *Table) Get(key string) *Room { return t.rooms[key] }

// Add creates a room (not yet active). The key is copied.
func (t *Table) Add(key []byte) *Room {
	r := &Room{Key: string(key)}
	t.rooms[r.Key] = r
	return r
}

// Remove drops an empty room from the table.
func (t *Table) Remove(r *Room) {
	if len(r.members) != 0 {
		panic("BUG: fanout: removing a room with members")
	}
	if t.rooms[r.Key] == r {
		delete(t.rooms, r.Key)
	}
}

// Len is the number of rooms on this loop.
func (t *Table) Len() int { return len(t.rooms) }

// Each calls fn for every room (loop only; fn must not add or remove rooms).
func (t *Table) Each(fn func(*Room)) {
	for _, r := range t.rooms {
		fn(r)
	}
}

// Join makes m a live member of r: it gets every frame delivered to r from
// now on.
func (t *Table) Join(r *Room, m *Member) {
	m.slots = append(m.slots, slot{room: r, pos: int32(len(r.members))})
	r.members = append(r.members, m)
}

// Leave removes m from r and reports whether r has no live members left.
// Safe during a delivery to another room, not during Deliver to r itself
// (the loop never closes a connection inside Deliver).
func (t *Table) Leave(r *Room, m *Member) (empty bool) {
	for i := range m.slots {
		if m.slots[i].room != r {
			continue
		}
		pos := m.slots[i].pos
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
		break
	}
	if len(r.members) == 0 && cap(r.members) > 64 {
		r.members = nil // a room that emptied gives back its big slice
	}
	return len(r.members) == 0
}

// LeaveAll removes m from every room and calls emptied for each room it
// leaves empty.
func (t *Table) LeaveAll(m *Member, emptied func(*Room)) {
	for len(m.slots) > 0 {
		r := m.slots[len(m.slots)-1].room
		if t.Leave(r, m) && emptied != nil {
			emptied(r)
		}
	}
	m.slots = nil
}

// Deliver queues frame for every live member of r. The frame is shared,
// not copied. Members that pass the outbound limit are marked Slow and
// collected for the loop to close (TakeSlow); nothing is dropped silently.
//
// Fast path: one append of a slice header per member; no allocation once
// the freelists are warm.
func (t *Table) Deliver(r *Room, frame []byte) {
	for _, m := range r.members {
		t.Enqueue(m, frame)
	}
}

// Enqueue queues one frame for one member (an ack, a joined, a replay).
func (t *Table) Enqueue(m *Member, frame []byte) {
	if m.Slow || m.Closed {
		return
	}
	n := len(frame)
	if m.bytes+m.Backlog+n > t.limit {
		m.Slow = true
		t.slow = append(t.slow, m)
		return
	}
	if len(m.pending) == cap(m.pending) {
		t.grow(m)
	}
	m.pending = append(m.pending, frame)
	m.bytes += n
	if !m.dirty {
		m.dirty = true
		t.dirty = append(t.dirty, m)
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
		return b
	}
	return make([][]byte, 0, classes[class])
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
			if len(t.free[i]) < maxFree {
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
	t.put(m.pending)
	m.pending = nil
	m.bytes = 0
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
	return d
}

// TakeUrgent returns members whose pending output passed flushAt, to be
// flushed before the tick (bounds the work and memory of one wake-up).
func (t *Table) TakeUrgent() []*Member {
	u := t.urgent
	t.urgent = t.urgent[:0]
	return u
}

// HasDirty reports whether anything waits for a flush.
func (t *Table) HasDirty() bool { return len(t.dirty) > 0 }

// TakeSlow returns members that passed the outbound limit since the last
// call.
func (t *Table) TakeSlow() []*Member {
	s := t.slow
	t.slow = t.slow[:0]
	return s
}

// HasSlow reports whether a member passed the outbound limit since the last
// TakeSlow.
func (t *Table) HasSlow() bool { return len(t.slow) > 0 }

// EachMember calls fn for every live member of r, over a copy of the member
// list, so fn may close connections (and so leave r).
func (t *Table) EachMember(r *Room, fn func(*Member)) {
	ms := append([]*Member(nil), r.members...)
	for _, m := range ms {
		fn(m)
	}
}
