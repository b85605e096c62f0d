package fanout

import (
	"context"
	"slices"
	"time"

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
func (p *positions) receipts(j posJob) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var marks []proto.Receipt
	var err error
	if p.reads != nil {
		marks, err = p.reads.ReadPositions(ctx, j.key, MaxReceipts+1)
	}
	ev := Event{kind: evReadDone, member: j.m, key: j.key, err: err}
	if err == nil {
		at := make(map[string]int, len(marks))
		for i, m := range marks {
			at[m.User] = i
		}
		add := func(user string, seq uint64) {
			if i, ok := at[user]; ok {
				marks[i].Seq = max(marks[i].Seq, seq)
				return
			}
			at[user] = len(marks)
			marks = append(marks, proto.Receipt{User: user, Seq: seq})
		}
		// Moved here and maybe not written yet: not moved since the last
		// hand-over, or handed over to a group commit at it.
		for k, seq := range p.dirty {
			if k.key == j.key {
				add(k.user, seq)
			}
		}
		for k, seq := range p.sent {
			if k.key == j.key {
				add(k.user, seq)
			}
		}
		// Moved on other nodes and announced here, maybe not written yet
		// by them: a receipts frame may already have told the asker, so
		// the answer must not go below it.
		for user, seq := range p.floor.rooms[j.key] {
			add(user, seq)
		}
		for i := range marks {
			if seq, ok := p.pos[posKey{j.key, marks[i].User}]; ok {
				marks[i].Seq = max(marks[i].Seq, seq)
			}
		}
		marks = sortMarks(marks)
		more := len(marks) > MaxReceipts
		if more {
			marks = marks[:MaxReceipts]
		}
		_, room := proto.SplitKey(j.key)
		ev.frame = proto.AppendReceiptsFrame(nil, room, marks, more)
	}
	p.post(int(j.loop), ev)
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
	return t.queuePos(posJob{receipts: true, key: key, m: m, loop: int32(t.idx)})
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
