package fanout

import (
	"slices"
	"sync/atomic"
)

// Replays (join catch-up pages, history answers) are paced by the member's
// outbound budget: each member has one store read in flight at a time, in
// the order asked (a catch-up goes to the back after each page, so several
// replays of one connection share it fairly), and a read starts only when
// the member's output is under one page. A replay of any length and message
// size then holds about two pages of the node's memory per connection (one
// leaving, one read), completes at the pace the client reads, and never
// makes it a slow consumer; its answers are not built for a connection
// already gone.

// maxQueuedReads bounds the history requests one member may have waiting;
// each is small (a room key and two numbers).
const maxQueuedReads = 64

// readQueue is a member's store reads.
type readQueue struct {
	items   []readItem
	reading bool        // a read is in flight
	paced   bool        // in the table's paced list
	gone    atomic.Bool // the connection closed: readers skip its reads
}

// readItem is a history request (join == nil) or a catch-up's next page.
type readItem struct {
	join   *joinState
	key    string
	before uint64
	limit  int
	// after, forward, fold: a history request's other terms (HistoryQuery).
	after         uint64
	forward, fold bool
	// presence: a presence query of key, not a history request.
	presence bool
}

// pageBytes is the size of one replay page: a history answer or a
// catch-up read. An eighth of the outbound limit keeps what a replay adds
// well under the limit that live messages are held to.
func (n *Node) pageBytes() int { return max(n.cfg.OutboundLimit/8, 16<<10) }

func (t *Table) queueRead(m *Member, it readItem) {
	c := m.Chat()
	if c.reads == nil {
		c.reads = &readQueue{}
	}
	c.reads.items = append(c.reads.items, it)
	t.pump(m)
}

// pump starts m's next store read if none is in flight and its output has
// left; otherwise the tick tries again (PumpPaced).
func (t *Table) pump(m *Member) {
	q := m.readQ()
	if q == nil || q.reading || len(q.items) == 0 || m.Out.Closed() {
		return
	}
	page := t.node.pageBytes()
	if m.Out.PendingBytes() >= page && m.Out.Owner.Buffered() == 0 {
		// The last page has not left yet, but the socket may take it now:
		// a replaying connection need not wait a tick per page.
		m.Out.Owner.Write()
		if m.Out.Closed() {
			return
		}
	}
	if m.Out.PendingBytes()+m.Out.Owner.Buffered() >= page {
		if !q.paced {
			q.paced = true
			t.paced = append(t.paced, m)
		}
		return
	}
	it := q.items[0]
	copy(q.items, q.items[1:])
	q.items[len(q.items)-1] = readItem{}
	q.items = q.items[:len(q.items)-1]
	if it.presence {
		q.reading = true
		t.node.read(readJob{kind: rPresence, table: t, member: m, key: it.key})
		return
	}
	if it.join == nil {
		q.reading = true
		t.node.read(readJob{kind: rHistory, table: t, member: m, key: it.key, before: it.before, limit: it.limit,
			after: it.after, forward: it.forward, fold: it.fold})
		return
	}
	j := it.join
	if m.findJoin(j.room) != j || !j.catchingUp {
		t.pump(m) // left meanwhile
		return
	}
	jb := readJob{kind: rReplay, table: t, member: m, room: j.room, key: j.room.key, after: j.after, upto: j.room.last}
	if !j.joined {
		jb.first = true
		jb.other = j.hasEpoch && j.epoch != j.room.epoch
	}
	if !t.node.tryRead(jb) {
		// The readers are behind, as in a reconnect storm of thousands
		// rejoining with since: closing the client (1013) would only bring
		// it back later with the same catch-up, and make the storm last.
		// The page waits at the front of its queue for the next tick.
		t.node.Stats.CatchupsDeferred.Add(1)
		q.items = slices.Insert(q.items, 0, it)
		if !q.paced {
			q.paced = true
			t.paced = append(t.paced, m)
		}
		return
	}
	q.reading = true
}

// PumpPaced retries the members whose reads waited for their output. The
// loop calls it at each flush tick, after writing.
func (t *Table) PumpPaced() {
	if len(t.paced) == 0 {
		return
	}
	ps := t.paced
	t.paced = nil
	for _, m := range ps {
		if q := m.readQ(); q != nil {
			q.paced = false
		}
		t.pump(m)
	}
}

// readDone ends m's read in flight.
func (m *Member) readDone() {
	if q := m.readQ(); q != nil {
		q.reading = false
	}
}
