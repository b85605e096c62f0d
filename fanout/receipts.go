package fanout

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// Receipts: members that joined a room with "receipts":true get, at most
// once a second per room, the users whose read position there moved. The
// positions goroutine gathers the moves it makes and those other nodes
// announce (the broker's read frames), and once a second hands each room's
// frame to the loops holding the room. A position moved by the user's own
// publish is no news to the room (its msg says as much) and is left out.

// MaxReceipts bounds a receipts query's answer.
const MaxReceipts = 1000

// receiptsFlush builds and sends the frames of the rooms whose positions
// moved since the last call. Positions goroutine.
func (p *positions) receiptsFlush() {
	if len(p.moved) > 0 {
		// The answers not posted yet go first: a receipts query answered
		// before these frames must not arrive after them, lower.
		p.flushAnswers()
	}
	for key, users := range p.moved {
		delete(p.moved, key)
		_, room := proto.SplitKey(key)
		marks := make([]proto.Receipt, 0, len(users))
		for u, seq := range users {
			marks = append(marks, proto.Receipt{User: u, Seq: seq})
		}
		frame := proto.AppendReceiptsFrame(nil, room, sortMarks(marks), false)
		p.n.hub.each(key, func(loop int) {
			p.n.tables[loop].Load().loop.Post(Event{kind: evReceipts, key: key, frame: frame})
		})
	}
}

// sortMarks orders marks newest first (then by user, so answers are
// stable).
func sortMarks(marks []proto.Receipt) []proto.Receipt {
	slices.SortFunc(marks, func(a, b proto.Receipt) int {
		switch {
		case a.Seq != b.Seq:
			if a.Seq > b.Seq {
				return -1
			}
			return 1
		case a.User < b.User:
			return -1
		case a.User > b.User:
			return 1
		}
		return 0
	})
	return marks
}

// receiptsRoom counts a loop in (d 1) or out (d -1) of those holding a
// receipts subscriber of the room key. Loops.
func (n *Node) receiptsRoom(key string, d int) {
	if n == nil {
		return
	}
	n.rcptMu.Lock()
	defer n.rcptMu.Unlock()
	if n.rcptRooms == nil {
		n.rcptRooms = map[string]int{}
	}
	if c := n.rcptRooms[key] + d; c > 0 {
		n.rcptRooms[key] = c
	} else {
		delete(n.rcptRooms, key)
	}
}

// hasReceipts reports whether a loop holds a receipts subscriber of the
// room key. Any goroutine.
func (n *Node) hasReceipts(key string) bool {
	n.rcptMu.RLock()
	defer n.rcptMu.RUnlock()
	return n.rcptRooms[key] > 0
}

// movedTo records that user's position in key moved to seq, for the
// room's next receipts frame.
func (p *positions) movedTo(key, user string, seq uint64) {
	if !p.n.hasReceipts(key) {
		// Nobody here asked for the room's receipts: at 10,000 marks a
		// second over 1,000 rooms, recording every move and building a
		// frame a second per room for no one cost the node ~3 % of its
		// samples. A subscriber hears of the moves from its join on.
		return
	}
	users := p.moved[key]
	if users == nil {
		users = map[string]uint64{}
		p.moved[key] = users
	}
	users[user] = max(users[user], seq)
}

// receipts answers a receipts query: every user's position in the room,
// newest first, at most MaxReceipts. The store's, with the moves not
// written yet that this node made or heard of from others.
//
// This goroutine takes only what it owns of the room (roomState) and hands
// the store's read, the merge and the encoding to a receipts worker: with
// PostgreSQL the read of up to 1001 positions takes a millisecond or more,
// and every mark, own-publish move and unread request of the node waited
// behind it (a flood of queries would hold them all). The worker gives the
// answer back (receiptsDone), which raises it by the positions this
// goroutine learned meanwhile and posts it in order with the receipts
// frames: it holds at least what an answer made whole on this goroutine
// at that moment would, so no position a receipts frame told the asker
// before it, whether sent before the query or while the store was read.
// A full worker queue is answered overloaded, as a full positions queue
// is.
func (p *positions) receipts(j posJob) {
	r := rcptJob{j: j, at: queryStamps{asked: time.Duration(j.seq), taken: Stamp()}}
	r.marks = p.roomState(j.key, nil)
	if p.reads == nil {
		r.marks = mergeMarks(nil, r.marks) // one per user
		p.receiptsDone(r)
		return
	}
	p.rcptGen++
	r.gen = p.rcptGen
	if p.rcptOut < cap(p.rcptDone) {
		select {
		case p.rcptQ[queryWorkerOf(j.key)] <- r:
			p.rcptOut++
			w := p.rcptWait[j.key]
			if w == nil {
				w = &rcptRoom{}
				p.rcptWait[j.key] = w
			}
			w.n++
			return
		default:
		}
	}
	p.n.Stats.ReceiptsRefused.Add(1)
	p.post(int(j.loop), Event{kind: evReadDone, flags: doneReceipts, member: j.m, key: j.key, err: proto.ErrOverloaded})
}

// rcptJob is a receipts query on its way to a worker and back.
type rcptJob struct {
	j     posJob
	gen   uint64          // positions.rcptGen when asked
	marks []proto.Receipt // asked: the room's positions held here; back: the answer's, merged, newest first (not cut at MaxReceipts)
	frame []byte          // back: the answer's frame
	err   error
	at    queryStamps
}

// rcptRoom counts a room's receipts queries at the workers and when a
// position of the room last moved here (a rcptGen).
type rcptRoom struct {
	n     int
	moved uint64
}

// roomState appends to dst the positions of the room key this goroutine
// holds that the store may not have yet.
func (p *positions) roomState(key string, dst []proto.Receipt) []proto.Receipt {
	// Moved here and maybe not written yet: not moved since the last
	// hand-over (walked whole: at most a second's moves, and an index by
	// room would cost every mark a map write), or handed over to a group
	// commit at it (sentMarks, by room).
	for k, seq := range p.dirty {
		if k.key == key {
			dst = append(dst, proto.Receipt{User: k.user, Seq: seq})
		}
	}
	for _, part := range [][]persist.ReadMark{p.sentMarks[:p.sentDue], p.sentMarks[p.sentDue:]} {
		i, _ := slices.BinarySearchFunc(part, key, func(m persist.ReadMark, key string) int { return strings.Compare(m.Key, key) })
		for ; i < len(part) && part[i].Key == key; i++ {
			dst = append(dst, proto.Receipt{User: part[i].User, Seq: part[i].Seq})
		}
	}
	// Moved on other nodes and announced here, maybe not written yet by
	// them: a receipts frame may already have told the asker, so the
	// answer must not go below it.
	for user, seq := range p.floor.rooms[key] {
		dst = append(dst, proto.Receipt{User: user, Seq: seq})
	}
	return dst
}

// touched notes that a position of the room key moved, for the receipts
// queries of the room at the workers (receiptsDone). Positions goroutine.
func (p *positions) touched(key string) {
	if len(p.rcptWait) == 0 {
		return
	}
	if w := p.rcptWait[key]; w != nil {
		w.moved = p.rcptGen
	}
}

// mergeMarks adds more to marks, keeping each user's larger position.
// Any goroutine: it touches nothing of positions'.
func mergeMarks(marks, more []proto.Receipt) []proto.Receipt {
	at := make(map[string]int, len(marks)+len(more))
	for i, m := range marks {
		at[m.User] = i
	}
	for _, m := range more {
		if i, ok := at[m.User]; ok {
			marks[i].Seq = max(marks[i].Seq, m.Seq)
			continue
		}
		at[m.User] = len(marks)
		marks = append(marks, m)
	}
	return marks
}

// receiptsWorker runs receipts queries' store reads and merges, and gives
// each back to the positions goroutine (rcptDone).
func (p *positions) receiptsWorker(q chan rcptJob) {
	defer p.n.wg.Done()
	for {
		select {
		case <-p.n.done:
			return
		case r := <-q:
			p.readReceipts(&r)
			select {
			case p.rcptDone <- r:
			case <-p.n.done:
				return
			}
		}
	}
}

// readReceipts reads r's room from the store, merges what the positions
// goroutine held into it and encodes the answer. Any goroutine.
func (p *positions) readReceipts(r *rcptJob) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var stored []proto.Receipt
	r.at.started = Stamp()
	stored, r.err = p.reads.ReadPositions(ctx, r.j.key, MaxReceipts+1)
	r.at.read = Stamp()
	if r.err == nil {
		r.marks = sortMarks(mergeMarks(stored, r.marks))
		r.frame = receiptsFrame(r.j.key, r.marks)
	}
}

// receiptsDone answers a receipts query the worker gave back (or one with
// no store to read): raised by the positions held here now, and, if one
// of the room's moved since the query was asked, merged with the room's
// state again, then posted in order with this goroutine's other answers
// and before any receipts frame it sends later. Positions goroutine.
func (p *positions) receiptsDone(r rcptJob) {
	key := r.j.key
	stale := false
	if r.gen > 0 {
		p.rcptOut--
		w := p.rcptWait[key]
		stale = w.moved >= r.gen
		if w.n--; w.n == 0 {
			delete(p.rcptWait, key)
		}
	}
	ev := Event{kind: evReadDone, flags: doneReceipts, member: r.j.m, key: key, err: r.err, frame: r.frame}
	if r.err == nil {
		marks := r.marks
		if stale {
			// Moved while the store was read: maybe a user the answer
			// does not hold yet, already in a receipts frame.
			marks = mergeMarks(marks, p.roomState(key, nil))
		}
		// Known here, maybe past the store's and no longer moving: held
		// from the store or another node's announcement, or handed to a
		// group commit still writing it.
		for i := range marks {
			if seq, ok := p.pos[posKey{key, marks[i].User}]; ok && seq > marks[i].Seq {
				marks[i].Seq = seq
				stale = true
			}
		}
		if stale || ev.frame == nil {
			ev.frame = receiptsFrame(key, sortMarks(marks))
		}
	}
	posted := Stamp()
	if r.at.started != 0 {
		ev.cursor = uint64(posted)
	}
	p.post(int(r.j.loop), ev)
	r.at.observe(p.n.hists.rcptPhases, posted)
}

// receiptsFrame encodes the answer of marks, newest first, cut at
// MaxReceipts. Any goroutine.
func receiptsFrame(key string, marks []proto.Receipt) []byte {
	more := len(marks) > MaxReceipts
	if more {
		marks = marks[:MaxReceipts]
	}
	_, room := proto.SplitKey(key)
	return proto.AppendReceiptsFrame(nil, room, marks, more)
}

// floors holds the positions other nodes announced and this node does not
// know yet, by room key and user: a receipts query reads its room's
// without walking the up to posCacheMax of every room. Positions
// goroutine.
type floors struct {
	rooms map[string]map[string]uint64
	n     int // entries in all rooms
}

func (f *floors) get(k posKey) uint64 { return f.rooms[k.key][k.user] }

// raise sets k's floor to at least seq. Past posCacheMax entries all are
// forgotten: a floor only keeps answers from going back meanwhile, and
// the store catches up with them.
func (f *floors) raise(k posKey, seq uint64) {
	if f.rooms == nil {
		f.rooms = map[string]map[string]uint64{}
	}
	if f.n >= posCacheMax {
		clear(f.rooms)
		f.n = 0
	}
	users := f.rooms[k.key]
	if users == nil {
		users = map[string]uint64{}
		f.rooms[k.key] = users
	}
	cur, ok := users[k.user]
	if !ok {
		f.n++
	}
	users[k.user] = max(cur, seq)
}

// take removes k's floor and returns it (0: none).
func (f *floors) take(k posKey) uint64 {
	users := f.rooms[k.key]
	seq, ok := users[k.user]
	if !ok {
		return 0
	}
	f.n--
	if len(users) == 1 {
		delete(f.rooms, k.key)
	} else {
		delete(users, k.user)
	}
	return seq
}

// Receipts asks every user's position in the room key for the client m
// (answered with a receipts frame). Loop only; false when the queue is
// full.
func (t *Table) Receipts(m *Member, key string) bool {
	n := t.node
	if n == nil {
		return false
	}
	return t.queuePos(posJob{receipts: true, key: key, m: m, loop: int32(t.idx), seq: uint64(Stamp())})
}

// SetReceipts makes m a receipts subscriber of the room key (a join with
// "receipts":true), or ends that. Loop only.
func (t *Table) SetReceipts(m *Member, key string, on bool) {
	c := m.Chat()
	i := slices.Index(c.receipts, key)
	switch {
	case on && i < 0:
		c.receipts = append(c.receipts, key)
		if t.receipts == nil {
			t.receipts = map[string][]*Member{}
		}
		if len(t.receipts[key]) == 0 {
			t.node.receiptsRoom(key, 1)
		}
		t.receipts[key] = append(t.receipts[key], m)
	case !on && i >= 0:
		c.receipts = slices.Delete(c.receipts, i, i+1)
		t.unsubscribeReceipts(m, key)
	}
}

func (t *Table) unsubscribeReceipts(m *Member, key string) {
	ms := t.receipts[key]
	if i := slices.Index(ms, m); i >= 0 {
		ms[i] = ms[len(ms)-1]
		ms[len(ms)-1] = nil
		ms = ms[:len(ms)-1]
	}
	if len(ms) == 0 {
		if _, ok := t.receipts[key]; ok {
			delete(t.receipts, key)
			t.node.receiptsRoom(key, -1)
		}
	} else {
		t.receipts[key] = ms
	}
}

// dropReceipts ends every receipts subscription of m (its close).
func (t *Table) dropReceipts(m *Member) {
	if m.chat == nil {
		return
	}
	for _, k := range m.chat.receipts {
		t.unsubscribeReceipts(m, k)
	}
	m.chat.receipts = nil
}
