package fanout

import (
	"errors"
	"unsafe"

	"github.com/roost-chat/roost/proto"
)

// Room is one room as seen by one loop: its live members, its joins on the
// way, and the order of its messages. The loop that owns the Table owns
// every field.
type Room struct {
	key     string
	members []*Member
	// noEcho counts the members joined with echo off (echo.go), at least:
	// fan looks for them only when it is not 0.
	noEcho int32
	// watchers are the live members that subscribed to presence.
	watchers []*Member
	// last is the newest seq delivered to this loop's members (or the
	// room's newest committed seq when it became active): a member that
	// joins now starts after last.
	last uint64
	// active is false until the broker subscription is up and last is
	// known; deliveries meanwhile wait in held.
	active bool
	// held are deliveries that cannot go out yet: they arrived before the
	// room was active, or ahead of a missing seq. Kept sorted by seq.
	held []Held
	// gapSince is the loop's clock (ms) when the oldest gap was first seen;
	// 0 when there is none.
	gapSince int64
	// repairing is set while a store read for a gap or a tail is in flight.
	repairing bool
	// joiners are members whose join waits for the room to become active
	// or for their catch-up to reach last; a room is removed only when it
	// has no live members and no joiners.
	joiners []*Member
	// epoch names the history last belongs to (the store's, read with the
	// room's head when it became active).
	epoch string
	// repairMore: the last repair read stopped at its bounds with more to
	// read; the next step follows once the members took most of this one.
	repairMore bool
	// tailPacedSince is the loop's clock (ms) when a tail repair's next
	// step started waiting for the members to take the last one (in
	// Table.tailPaced); 0 when it does not wait.
	tailPacedSince int64
}

// Held is a delivery that waits for its turn.
type Held struct {
	Seq   uint64
	Frame []byte
}

// Members is the number of live members.
func (r *Room) Members() int { return len(r.members) }

// backlogged reports whether a live member of r has more than n bytes of
// output waiting.
func (r *Room) backlogged(n int) bool {
	for _, m := range r.members {
		if m.Out.PendingBytes()+m.Out.Backlog() > n {
			return true
		}
	}
	return false
}

// unwatch forgets m as a presence subscriber of r.
func (r *Room) unwatch(m *Member) {
	for i, w := range r.watchers {
		if w == m {
			last := len(r.watchers) - 1
			r.watchers[i] = r.watchers[last]
			r.watchers[last] = nil
			r.watchers = r.watchers[:last]
			return
		}
	}
}

// idle reports whether the room can be dropped from its table.
func (r *Room) idle() bool { return len(r.members) == 0 && len(r.joiners) == 0 }

// removeJoiner forgets m as a joiner of r.
func (r *Room) removeJoiner(m *Member) {
	for i, j := range r.joiners {
		if j == m {
			last := len(r.joiners) - 1
			r.joiners[i] = r.joiners[last]
			r.joiners[last] = nil
			r.joiners = r.joiners[:last]
			return
		}
	}
}

// joinState is a join not yet live: waiting for the room to become active
// on this loop, or catching up from the store.
type joinState struct {
	room       *Room
	since      uint64
	hasSince   bool
	catchingUp bool
	// ahead: since is past the room's newest seq on this loop (the client
	// saw newer messages on another node than have reached this one); it
	// goes live when the room gets there (promoteAhead), not before, or it
	// would receive those messages a second time.
	ahead bool
	after uint64 // catch-up cursor: everything <= after has been sent
	// epoch is the one the client sent (hasEpoch); joined is set once the
	// joined frame went out (after the first page told whether the replay
	// recovers everything).
	epoch    string
	hasEpoch bool
	joined   bool
	presence bool // subscribes to presence once live
	// next is the member's next join on the way (Member.joins).
	next *joinState
}

func (m *Member) findJoin(r *Room) *joinState {
	for j := m.joins; j != nil; j = j.next {
		if j.room == r {
			return j
		}
	}
	return nil
}

func (m *Member) dropJoin(r *Room) {
	for p := &m.joins; *p != nil; p = &(*p).next {
		if j := *p; j.room == r {
			*p, j.next = j.next, nil
			return
		}
	}
}

// Errors of Join and History, for the loop to answer with an err frame.
var (
	ErrJoined       = errors.New("already joined: leave first")
	ErrRoomLimit    = errors.New("room limit of this connection reached")
	ErrTooManyReads = errors.New("too many history requests waiting: read the answers first")
)

// Resume is what a join says of the client's position (docs/protocol.md,
// Resume): since and, when the client kept it, the epoch it came from.
type Resume struct {
	Since    uint64
	HasSince bool
	Epoch    []byte
	HasEpoch bool
	// Presence: the member subscribes to the room's presence_diff frames,
	// unless the room has MaxPresence subscribers on this node already
	// (ErrPresenceLimit; 0: no limit).
	Presence    bool
	MaxPresence int
}

// Join makes m a member of the room key (RoomKey). With hasSince, the
// stored messages after since are replayed first, a page at a time, and m
// goes live once the replay reaches the room's newest seq, so it sees no
// gap and no duplicate. m hears `joined` with the room's newest seq once
// the room is live on this loop. Loop only.
func (t *Table) Join(m *Member, key []byte, rs Resume) error {
	r := t.lookup(key)
	if r != nil && (m.in(r) || m.findJoin(r) != nil) {
		return ErrJoined
	}
	if m.Rooms()+m.Joining() >= t.node.cfg.MaxRooms {
		return ErrRoomLimit
	}
	if rs.Presence && rs.MaxPresence > 0 && t.node.pres.watchers(string(key)) >= rs.MaxPresence {
		// Counted when live: joins on the way at once may pass the
		// limit by their number.
		return ErrPresenceLimit
	}
	if r != nil && r.active && (!rs.HasSince || rs.Since == r.last && (!rs.HasEpoch || string(rs.Epoch) == r.epoch)) {
		// Fast path: the room is live on this loop and there is nothing
		// to replay: a member at once, nothing allocated but the user's
		// presence entry when this is its first connection in the room here.
		t.joinLive(r, m, rs.Presence)
		t.sendJoined(m, r, &proto.Joined{Seq: r.last, Epoch: r.epoch, Resumed: rs.HasSince, Recovered: true})
		return nil
	}
	if r == nil {
		r = t.add(key)
		defer t.node.hub.join(r.key, t.idx) // after the join is parked: the answer may come at once
	}
	j := &joinState{room: r, since: rs.Since, hasSince: rs.HasSince, hasEpoch: rs.HasEpoch, presence: rs.Presence}
	if rs.HasEpoch {
		j.epoch = string(rs.Epoch)
	}
	j.next, m.joins = m.joins, j
	r.joiners = append(r.joiners, m)
	if r.active {
		t.startJoin(m, j)
	}
	return nil
}

// Leave ends m's membership of the room key, or its join on the way.
// Loop only.
func (t *Table) Leave(m *Member, key []byte) {
	r := t.lookup(key)
	if r == nil {
		return
	}
	t.echoOn(m, r)
	if m.chat != nil && len(m.chat.receipts) > 0 {
		t.SetReceipts(m, r.key, false)
	}
	if m.findJoin(r) != nil {
		r.removeJoiner(m)
		m.dropJoin(r)
	} else if m.in(r) {
		t.leave(r, m)
		t.node.Stats.Joined.Add(-1)
	}
	t.removeIfIdle(r)
}

// Close forgets m everywhere: rooms, joins on the way, pending output.
// The loop calls it when the connection is gone (its Out closed). Loop only.
func (t *Table) Close(m *Member) {
	t.dropReceipts(m)
	if m.chat != nil && m.chat.own != nil {
		for _, k := range m.chat.own.rooms {
			if r := t.rooms[k]; r != nil && r.noEcho > 0 {
				r.noEcho--
			}
		}
		m.chat.own = nil
	}
	t.node.Stats.Joined.Add(-int64(m.Rooms()))
	if q := m.readQ(); q != nil {
		q.gone.Store(true)
		q.items = nil
	}
	for j := m.joins; j != nil; j = j.next {
		j.room.removeJoiner(m)
		t.removeIfIdle(j.room)
	}
	m.joins = nil
	t.leaveAll(m)
	t.q.Drop(&m.Out)
}

// Presence queues a presence answer of the room key to m: its number of
// users on every node and up to proto.MaxPresenceUsers names. It waits its
// turn among m's history requests (ErrTooManyReads past the bound). Loop
// only.
func (t *Table) Presence(m *Member, key string) error {
	if q := m.readQ(); q != nil && len(q.items) >= maxQueuedReads {
		return ErrTooManyReads
	}
	t.queueRead(m, readItem{key: key, presence: true})
	return nil
}

// History reads up to limit stored messages of the room key before seq
// before (0: the newest) and queues them to m as one history frame,
// bounded by bytes too (more:true when it stopped there). A member's
// history answers come one at a time, in order, each read once the
// previous one has left; at most maxQueuedReads wait (ErrTooManyReads).
// Loop only.
func (t *Table) History(m *Member, key string, before uint64, limit int) error {
	return t.Query(m, key, HistoryQuery{Before: before, Limit: limit})
}

// HistoryQuery is one history request: the messages before Before (0: the
// newest), or, with Forward, those after After; Fold lists only messages,
// each as it stands now (docs/protocol.md, "Messages that change").
type HistoryQuery struct {
	Before, After uint64
	Forward, Fold bool
	Limit         int
}

// Query is History with every term of a request. Loop only.
func (t *Table) Query(m *Member, key string, q HistoryQuery) error {
	if q := m.readQ(); q != nil && len(q.items) >= maxQueuedReads {
		return ErrTooManyReads
	}
	t.queueRead(m, readItem{key: key, before: q.Before, limit: q.Limit, after: q.After, forward: q.Forward, fold: q.Fold})
	return nil
}

func (t *Table) sendJoined(m *Member, r *Room, jf *proto.Joined) {
	a := t.arena
	room := roomName(r.key)
	f := a.Keep(proto.AppendJoinedFrame(a.Space(len(room)+proto.MaxJoinedExtra), room, jf))
	if m.sse != nil {
		f = t.sseFrames(m, r, f, jf)
	}
	t.enqueue(m, f)
}

func (t *Table) sendErr(m *Member, ref []byte, code proto.Code, msg string) {
	a := t.arena
	f := a.Keep(proto.AppendErrFrame(a.Space(64+6*len(ref)+2*len(msg)), ref, code, msg))
	if m.sse != nil {
		// A stream's rooms are fixed: one it cannot join ends it, after
		// the err event, and its client's reconnect tries again.
		t.enqueue(m, t.sseFrames(m, nil, f, nil))
		m.Out.Owner.Resync()
		return
	}
	t.enqueue(m, f)
}

// startJoin runs once the room is active on this loop. Without since,
// joined goes out with the room's newest seq and the member is live. With
// since, the first page of the replay is read before joined goes out, so
// that joined can say whether everything after since follows (Resume): the
// epoch differs or since is past the store's newest seq (the client's seqs
// belong to another history: the replay starts at the oldest stored
// message), or retention removed messages after since. The replay goes on
// a page at a time, each read once the previous one has left (pump); the
// member goes live when it has reached the room's newest seq, so it sees no
// gap and no duplicate. A since past the room's newest seq here but not
// past the store's waits for the room to reach it (its messages are on
// their way through the broker).
func (t *Table) startJoin(m *Member, j *joinState) {
	r := j.room
	if !j.hasSince || j.since == r.last && (!j.hasEpoch || j.epoch == r.epoch) {
		t.sendJoined(m, r, &proto.Joined{Seq: r.last, Epoch: r.epoch, Resumed: j.hasSince, Recovered: true})
		j.joined = true
		t.goLive(m, j)
		return
	}
	j.catchingUp = true
	j.after = j.since
	t.queueRead(m, readItem{join: j})
}

func (t *Table) goLive(m *Member, j *joinState) {
	r := j.room
	r.removeJoiner(m)
	m.dropJoin(r)
	t.joinLive(r, m, j.presence)
}

// replayed takes one page of catch-up. The first one decides what joined
// says.
func (t *Table) replayed(ev *Event) {
	m := ev.member
	m.readDone()
	if m.Out.Closed() {
		return
	}
	defer t.pump(m)
	j := m.findJoin(ev.room)
	if j == nil || !j.catchingUp {
		return // left meanwhile
	}
	r := j.room
	if ev.err != nil {
		t.abandon(m, j)
		return
	}
	if !j.joined {
		j.joined = true
		jf := proto.Joined{Seq: r.last, Epoch: r.epoch, Resumed: true, Recovered: true}
		switch {
		case ev.flags&readAhead != 0:
			// Not past the store's newest seq: the rest is on its way to
			// this loop. Wait for the room to reach since, or catch up to
			// where it got meanwhile.
			t.sendJoined(m, r, &jf)
			if j.since > r.last {
				j.catchingUp = false
				j.ahead, j.after = true, j.since
				return
			}
			if j.since == r.last {
				t.goLive(m, j)
				return
			}
			t.queueRead(m, readItem{join: j})
			return
		case ev.flags&readOther != 0:
			// Another history: everything stored follows, from the oldest.
			jf.Recovered = false
			jf.From = ev.seq
		case ev.seq != 0 && ev.seq != j.since+1, ev.seq == 0 && ev.cursor > j.since:
			// Retention removed messages after since.
			jf.Recovered = false
			jf.From = ev.seq
		}
		if !jf.Recovered {
			t.node.Stats.ResumesLost.Add(1)
			if jf.From == 0 {
				jf.From = ev.cursor + 1 // nothing stored up to the page's end: the next live one
			}
		}
		t.sendJoined(m, r, &jf)
		j.after = ev.cursor // for another history, below since: it starts over
	} else if ev.seq != 0 && ev.seq != j.after+1 || ev.seq == 0 && ev.cursor > j.after {
		// Retention removed messages while the catch-up ran: this stream
		// cannot continue without a gap. The client rejoins and is told.
		t.abandon(m, j)
		return
	}
	if len(ev.frame) > 0 {
		t.enqueueReplay(m, r, ev.frame)
	}
	j.after = max(j.after, ev.cursor)
	if j.after >= r.last {
		t.goLive(m, j)
		return
	}
	t.queueRead(m, readItem{join: j})
}

// abandon ends a catch-up that cannot go on (the store failed, or messages
// vanished under it): the client is closed with 1013 and rejoins.
func (t *Table) abandon(m *Member, j *joinState) {
	r := j.room
	r.removeJoiner(m)
	m.dropJoin(r)
	t.removeIfIdle(r)
	t.node.Stats.CatchupsAbandoned.Add(1)
	m.Out.Owner.Resync()
}

func (t *Table) historyDone(ev *Event) {
	m := ev.member
	m.readDone()
	if m.Out.Closed() {
		return
	}
	t.answer(m)
	defer t.pump(m)
	if ev.err != nil {
		msg := "cannot read history now: retry"
		if ev.flags&readPresence != 0 {
			msg = "cannot read presence now: retry"
		}
		t.sendErr(m, roomName(ev.key), proto.CodeOverloaded, msg)
		return
	}
	t.enqueueReplay(m, nil, ev.frame)
}

// removeIfIdle drops a room nobody on this loop needs any more.
func (t *Table) removeIfIdle(r *Room) {
	if !r.idle() || t.rooms[r.key] != r {
		return
	}
	t.remove(r)
	if t.node != nil {
		t.node.hub.leave(r.key, t.idx)
	}
}

// subscribed: the node is subscribed to key; read the room's newest seq
// (after subscribing, so nothing committed later can be missed).
func (t *Table) subscribed(key string, err error) {
	r := t.rooms[key]
	if r == nil || r.active {
		return
	}
	if err != nil {
		t.activate(r, 0, "", err)
		return
	}
	t.node.read(readJob{kind: rLastSeq, table: t, room: r, key: r.key})
}

// activate makes a room live on this loop at seq, releases what was held,
// and starts the parked joins.
func (t *Table) activate(r *Room, seq uint64, epoch string, err error) {
	if t.rooms[r.key] != r || r.active {
		return
	}
	if err != nil {
		joiners := r.joiners
		r.joiners = nil
		for _, m := range joiners {
			m.dropJoin(r)
			switch {
			case m.Out.Closed():
			case errors.Is(err, proto.ErrRoomLimit):
				// Reading the room's head makes it; its app has all the
				// rooms it may have.
				t.sendErr(m, roomName(r.key), proto.CodeForbidden, "cannot join: the app has its maximum of rooms")
			default:
				t.sendErr(m, roomName(r.key), proto.CodeOverloaded, "cannot join now: try again")
			}
		}
		r.held = nil
		t.removeIfIdle(r)
		return
	}
	r.active = true
	r.last = seq
	r.epoch = epoch
	held := r.held
	r.held = nil
	for _, h := range held {
		t.deliver(r, h.Seq, h.Frame, nil)
	}
	joiners := r.joiners
	r.joiners = nil
	for _, m := range joiners {
		if j := m.findJoin(r); j != nil && !m.Out.Closed() {
			r.joiners = append(r.joiners, m) // startJoin removes it again when live
			t.startJoin(m, j)
		}
	}
	if t.tailWant[r] {
		t.readTails() // a delivery overflowed while the room was joining
	}
	t.removeIfIdle(r)
}

// deliver fans one message out to a room's members, in seq order: a
// duplicate is dropped, a message ahead of a missing seq is held until the
// gap is filled (by the broker or, after GapWindow, from the store).
//
// event is the message's SSE event when the hub built it for the node's
// SSE members (sseEvent), nil otherwise: a held message, one read from the
// store, or a room without SSE members when the hub saw it.
func (t *Table) deliver(r *Room, seq uint64, frame, event []byte) {
	if !r.active {
		r.held = insertHeld(r.held, seq, frame)
		return
	}
	if seq <= r.last {
		return
	}
	if seq == r.last+1 && len(r.held) == 0 {
		// Fast path: in order, nothing held.
		t.fan(r, seq, frame, event)
		r.last = seq
		if len(r.joiners) > 0 {
			t.promoteAhead(r)
		}
		return
	}
	r.held = insertHeld(r.held, seq, frame)
	t.releaseHeld(r)
}

// promoteAhead makes live each joiner of r whose since was ahead of this
// loop once the room has reached it: the next seq delivered is the first it
// has not seen. Deliveries advance r.last one seq at a time, so equality
// catches it; only a gap given up on jumps past, and then the joiner is
// closed like the room's members.
func (t *Table) promoteAhead(r *Room) {
	// backwards: goLive swaps the last joiner into the removed slot
	for i := len(r.joiners) - 1; i >= 0; i-- {
		if i >= len(r.joiners) {
			continue
		}
		m := r.joiners[i]
		j := m.findJoin(r)
		if j == nil || !j.ahead || j.after > r.last {
			continue
		}
		if j.after == r.last {
			t.goLive(m, j)
			continue
		}
		r.removeJoiner(m)
		m.dropJoin(r)
		m.Out.Owner.Resync()
	}
}

func (t *Table) releaseHeld(r *Room) {
	i := 0
	for ; i < len(r.held); i++ {
		h := r.held[i]
		if h.Seq <= r.last {
			continue
		}
		if h.Seq != r.last+1 {
			break
		}
		t.fan(r, h.Seq, h.Frame, nil)
		r.last = h.Seq
		if len(r.joiners) > 0 {
			t.promoteAhead(r)
		}
	}
	if i > 0 {
		n := copy(r.held, r.held[i:])
		clear(r.held[n:])
		r.held = r.held[:n]
	}
	if len(r.held) == 0 {
		r.gapSince = 0
		return
	}
	if r.gapSince == 0 {
		r.gapSince = t.loop.Now()
		t.gaps = append(t.gaps, r)
	}
}

func insertHeld(h []Held, seq uint64, frame []byte) []Held {
	i := len(h)
	for i > 0 && h[i-1].Seq > seq {
		i--
	}
	if i > 0 && h[i-1].Seq == seq {
		return h // duplicate
	}
	h = append(h, Held{})
	copy(h[i+1:], h[i:])
	h[i] = Held{Seq: seq, Frame: frame}
	return h
}

// CheckGaps asks the store for messages missing longer than GapWindow, and
// retries tail reads that failed. The loop calls it at each flush tick.
func (t *Table) CheckGaps() {
	if t.node == nil {
		return
	}
	now := t.loop.Now()
	window := t.node.cfg.GapWindow.Milliseconds()
	if len(t.tailRetry) > 0 && now >= t.tailRetryAt {
		for _, r := range t.tailRetry {
			t.queueTail(r)
		}
		clear(t.tailRetry)
		t.tailRetry = t.tailRetry[:0]
		t.readTails()
	}
	t.pumpTails(now, window)
	if len(t.gaps) == 0 {
		return
	}
	keep := t.gaps[:0]
	for _, r := range t.gaps {
		if t.rooms[r.key] != r || len(r.held) == 0 {
			r.gapSince = 0
			continue
		}
		keep = append(keep, r)
		if r.repairing || now-r.gapSince < window {
			continue
		}
		if r.repairMore && r.backlogged(t.q.Limit()/2) && now-r.gapSince < 10*window {
			continue // paced: members still hold much of the last step
		}
		r.repairing = true
		t.node.Stats.Repairs.Add(1)
		t.node.read(readJob{kind: rRepair, table: t, room: r, key: r.key, after: r.last, upto: r.held[0].Seq - 1})
	}
	clear(t.gaps[len(keep):])
	t.gaps = keep
}

// repaired delivers messages read from the store, every seq up to upto:
// a gap, or for a tail read what the broker may have lost. If the store
// did not have them either, members cannot be given a gapless stream:
// they are closed with 1013 and rejoin with since.
func (t *Table) repaired(r *Room, held []Held, upto uint64, tail, more bool, err error) {
	defer t.readTails()
	if tail {
		t.tailReads--
	}
	if t.rooms[r.key] != r {
		return
	}
	r.repairing = false
	for _, h := range held {
		t.deliver(r, h.Seq, h.Frame, nil)
	}
	if err != nil {
		if tail {
			if len(t.tailRetry) == 0 {
				t.tailRetryAt = t.loop.Now() + t.node.cfg.GapWindow.Milliseconds()
			}
			t.tailRetry = append(t.tailRetry, r)
		}
		return // a gap is tried again after the next window
	}
	// The store's oldest message is past the room's next seq: what lies
	// between is gone from the store too (retention, --keep). Reading on
	// would answer this same step again and again, the members waiting
	// for ever; they get the verdict below now.
	lost := len(held) > 0 && held[0].Seq > r.last+1
	if more && !lost {
		// One bounded step of a long repair: the next follows once the
		// members have taken most of this one (CheckGaps; readTails).
		r.repairMore = true
		if r.gapSince != 0 {
			r.gapSince = t.loop.Now() - t.node.cfg.GapWindow.Milliseconds()
		}
		if tail {
			if r.backlogged(t.q.Limit() / 2) {
				// As a gap's steps are (CheckGaps): the next step is read
				// once the members have taken most of this one, so that a
				// member that reads slowly is not closed as a slow consumer
				// for messages the store holds.
				r.tailPacedSince = t.loop.Now()
				t.tailPaced = append(t.tailPaced, r)
			} else {
				t.queueTail(r)
			}
		}
		return
	}
	r.repairMore = false
	if !lost && (r.last >= upto || len(r.held) == 0 || r.held[0].Seq == r.last+1) {
		// Everything asked for is delivered. What is still held waits
		// behind a newer gap (messages in flight meanwhile), which gets a
		// window of its own rather than a verdict from this read.
		if r.gapSince != 0 {
			r.gapSince = t.loop.Now()
		}
		t.releaseHeld(r)
		return
	}
	// The store answered but the gap stays: give up on this stream.
	t.node.Stats.GapCloses.Add(1)
	for _, m := range append([]*Member(nil), r.members...) { // a close leaves r
		t.q.Drop(&m.Out)
		m.Out.Owner.Resync()
	}
	r.last = r.held[0].Seq - 1
	if len(r.joiners) > 0 {
		t.promoteAhead(r)
	}
	t.releaseHeld(r)
	if more && tail {
		t.queueTail(r) // the rest of the tail, for those who join from here
	}
}

// Lost tells the table that deliveries of the rooms keys did not reach
// the loop (its inbox was full): each room's tail is read from the store,
// as after a broker reset; deliveries queued meanwhile are placed by seq,
// duplicates dropped. A room still joining is read once it is active,
// since its starting seq may predate the lost message. Loop only.
func (t *Table) Lost(keys map[string]struct{}) {
	for key := range keys {
		if r := t.rooms[key]; r != nil {
			t.queueTail(r)
		}
	}
	t.readTails()
}

// reset: the broker may have lost messages of any room; read each active
// room's tail from the store and deliver what is missing.
func (t *Table) reset() {
	for _, r := range t.rooms {
		if r.active {
			t.queueTail(r)
		}
	}
	t.readTails()
}

func (t *Table) queueTail(r *Room) {
	if r.tailPacedSince != 0 {
		return // its paced step reads up to the newest seq anyway (pumpTails)
	}
	if t.tailWant == nil {
		t.tailWant = make(map[*Room]bool)
	}
	if !t.tailWant[r] {
		t.tailWant[r] = true
		t.tails = append(t.tails, r)
	}
}

// pumpTails queues the next step of the tail repairs that wait for their
// members (tailPaced): once no member holds more than half the outbound
// limit, or after ten gap windows whatever the members hold, so that one
// member that stopped reading does not hold the room back (it is then
// closed as a slow consumer, as it would be by live traffic).
func (t *Table) pumpTails(now, window int64) {
	if len(t.tailPaced) == 0 {
		return
	}
	keep := t.tailPaced[:0]
	queued := false
	for _, r := range t.tailPaced {
		if t.rooms[r.key] != r {
			r.tailPacedSince = 0
			continue
		}
		if r.backlogged(t.q.Limit()/2) && now-r.tailPacedSince < 10*window {
			keep = append(keep, r)
			continue
		}
		r.tailPacedSince = 0
		t.queueTail(r)
		queued = true
	}
	clear(t.tailPaced[len(keep):])
	t.tailPaced = keep
	if queued {
		t.readTails()
	}
}

// maxTailReads bounds one loop's tail reads in flight after a reset.
const maxTailReads = 64

// readTails starts tail reads of queued rooms, up to maxTailReads in
// flight. A room with a gap repair in flight waits for it (repaired calls
// back here), so that a reset during a repair is not lost.
func (t *Table) readTails() {
	for n := len(t.tails); n > 0 && t.tailReads < maxTailReads; n-- {
		r := t.tails[0]
		t.tails[0] = nil
		t.tails = t.tails[1:]
		if t.rooms[r.key] != r {
			delete(t.tailWant, r)
			continue
		}
		if r.repairing || !r.active {
			// activate calls back here once the room is live
			t.tails = append(t.tails, r)
			continue
		}
		delete(t.tailWant, r)
		r.repairing = true
		t.tailReads++
		t.node.read(readJob{kind: rRepair, table: t, room: r, key: r.key, after: r.last, upto: 0})
	}
	if len(t.tails) == 0 {
		t.tails = nil
	}
}

// roomName is the room part of a key, without a copy.
func roomName(key string) []byte {
	_, room := proto.SplitKey(key)
	return unsafe.Slice(unsafe.StringData(room), len(room))
}
