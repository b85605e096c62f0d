package fanout

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// Read positions: a user's newest read seq in a room. One goroutine owns
// them on a node (positions): it checks a mark against the room's newest
// seq, keeps the larger of the stored position and the mark, answers the
// client, sends the answer to the user's other connections on every node
// (through the broker, on proto.ReadKey) and writes the positions that
// moved to the store coalesced: the latest per user and room, all of them
// in one statement once a second.

// ErrReadBeyond refuses a read mark past the room's newest seq.
var ErrReadBeyond = errors.New("seq is beyond the room's newest message")

const (
	posQueue      = 8192        // marks waiting for the positions goroutine
	posFlushEvery = time.Second // the most often a position is written
	posCacheMax   = 200_000     // cached positions past which clean ones are forgotten
)

type posKey struct{ key, user string }

type posJob struct {
	own      bool // a publish of the user (no answer, no check)
	seen     bool // another node's answer: a floor for this node's view
	receipts bool // a receipts query
	key      string
	user     string
	seq      uint64
	rooms    []string // unread: the rooms asked (key is then the app)
	m        *Member  // the client that asked (nil: the API)
	loop     int
	reply    chan posReply // the API's answer
}

type posReply struct {
	seq    uint64
	unread []byte // an unread answer's rooms object
	err    error
}

// positions is the node's read positions, owned by its goroutine.
type positions struct {
	n      *Node
	reads  persist.Reads // nil: the store keeps none, so the node keeps them in memory
	jobs   chan posJob
	pos    map[posKey]uint64            // known positions (a cache over reads)
	floor  map[posKey]uint64            // positions other nodes announced, not yet known here
	dirty  map[posKey]uint64            // moved since the last write
	newest map[string]uint64            // rooms' newest seqs seen
	moved  map[string]map[string]uint64 // room key -> user -> position, for the next receipts (receipts.go)
	buf    []persist.ReadMark
}

func newPositions(n *Node, st persist.Store) *positions {
	p := &positions{n: n, jobs: make(chan posJob, posQueue), pos: map[posKey]uint64{},
		dirty: map[posKey]uint64{}, newest: map[string]uint64{}, floor: map[posKey]uint64{}, moved: map[string]map[string]uint64{}}
	p.reads, _ = st.(persist.Reads)
	return p
}

// MarkRead sets user's read position in the room key to at least seq, for
// the client m on loop (its answer comes as a read frame, or an err).
// Loop only; never blocks: with the queue full it answers overloaded.
func (t *Table) MarkRead(m *Member, key, user string, seq uint64) bool {
	n := t.node
	if n == nil {
		return false
	}
	n.tagOf(m)
	select {
	case n.pos.jobs <- posJob{key: key, user: user, seq: seq, m: m, loop: t.idx}:
		return true
	default:
		return false
	}
}

// MarkRead is the Server API's read mark: it waits for the outcome.
func (n *Node) MarkRead(ctx context.Context, key, user string, seq uint64) (uint64, error) {
	reply := make(chan posReply, 1)
	select {
	case n.pos.jobs <- posJob{key: key, user: user, seq: seq, reply: reply}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case r := <-reply:
		return r.seq, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// ownPublish moves the publisher's position to its new message: one who
// writes has read up to there. Publish workers; never blocks (a full
// queue skips it, counted).
func (n *Node) ownPublish(key, user string, seq uint64) {
	select {
	case n.pos.jobs <- posJob{own: true, key: key, user: user, seq: seq}:
	default:
		n.Stats.ReadMarksDropped.Add(1)
	}
}

func (p *positions) run() {
	defer p.n.wg.Done()
	tick := time.NewTicker(posFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.n.done:
			p.flush()
			return
		case j := <-p.jobs:
			p.do(j)
		case <-tick.C:
			p.flush()
			p.receiptsFlush()
		}
	}
}

func (p *positions) do(j posJob) {
	k := posKey{j.key, j.user}
	if j.receipts {
		p.receipts(j)
		return
	}
	if j.seen {
		// Another node wrote it (coalesced, maybe not yet): this node's
		// answers must not go below it meanwhile.
		p.movedTo(j.key, j.user, j.seq)
		p.newest[j.key] = max(p.newest[j.key], j.seq)
		if cur, ok := p.pos[k]; ok {
			p.pos[k] = max(cur, j.seq)
		} else {
			if len(p.floor) >= posCacheMax {
				clear(p.floor)
			}
			p.floor[k] = max(p.floor[k], j.seq)
		}
		return
	}
	if j.rooms != nil {
		p.unread(j)
		return
	}
	if j.own {
		p.newest[j.key] = max(p.newest[j.key], j.seq)
		p.move(k, j.seq)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	before := p.pos[k]
	seq, err := p.mark(ctx, k, j.seq)
	if j.reply != nil {
		j.reply <- posReply{seq: seq, err: err}
	}
	if m := j.m; m != nil {
		p.n.tables[j.loop].Load().loop.Post(Event{kind: evReadDone, member: m, key: j.key, seq: seq, err: err})
	}
	if err == nil && seq > before {
		// Moved (as far as this node knew): the user's other connections
		// hear of it; an unmoved position is news to none of them.
		p.broadcast(j.key, j.user, seq, j.m)
	}
}

// Unread asks the unread counts of user in rooms of app for the client m
// on this loop (answered with an unread frame). Loop only; false when the
// queue is full.
func (t *Table) Unread(m *Member, app, user string, rooms []string) bool {
	n := t.node
	if n == nil {
		return false
	}
	select {
	case n.pos.jobs <- posJob{key: app, user: user, rooms: rooms, m: m, loop: t.idx}:
		return true
	default:
		return false
	}
}

// Unread is the Server API's unread counts: the rooms object of the
// unread answer.
func (n *Node) Unread(ctx context.Context, app, user string, rooms []string) ([]byte, error) {
	reply := make(chan posReply, 1)
	select {
	case n.pos.jobs <- posJob{key: app, user: user, rooms: rooms, reply: reply}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-reply:
		return r.unread, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// unread counts, per room, the messages after the user's position that are
// not edits, deletes or reactions: the store keeps, next to each entry,
// the room's count of messages up to it, so the count is the room's count
// less the one at the position, read with the room's seq and never by
// scanning messages. The position the node holds (a mark not saved yet)
// is the floor of the stored one.
func (p *positions) unread(j posJob) {
	n := len(j.rooms)
	keys := make([]string, n)
	for i, r := range j.rooms {
		keys[i] = proto.RoomKey(j.key, r)
	}
	vals := make([]uint64, 3*n)
	last, read, count := vals[:n], vals[n:2*n], vals[2*n:]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, k := range keys {
		pk := posKey{k, j.user}
		read[i] = max(p.pos[pk], p.floor[pk])
	}
	var err error
	if p.reads != nil {
		err = p.reads.Unread(ctx, keys, j.user, last, read, count)
	} else {
		for i, k := range keys {
			if last[i], err = p.n.store.LastSeq(ctx, k); err != nil {
				break
			}
			count[i] = last[i] - min(read[i], last[i])
		}
	}
	var obj []byte
	if err == nil {
		for i, k := range keys {
			last[i] = max(last[i], p.newest[k])
			if read[i] >= last[i] {
				read[i], count[i] = last[i], 0
			}
		}
		obj = proto.AppendUnreadObject(nil, j.rooms, read, last, count)
	}
	if j.reply != nil {
		j.reply <- posReply{unread: obj, err: err}
		return
	}
	ev := Event{kind: evReadDone, member: j.m, key: j.key, err: err}
	if err == nil {
		ev.frame = proto.AppendUnreadFrame(nil, j.rooms, read, last, count)
	}
	p.n.tables[j.loop].Load().loop.Post(ev)
}

// mark applies one mark: checked against the room's newest seq, then the
// larger of the position and seq.
func (p *positions) mark(ctx context.Context, k posKey, seq uint64) (uint64, error) {
	if seq > p.newest[k.key] {
		last, err := p.n.store.LastSeq(ctx, k.key)
		if err != nil {
			return 0, err
		}
		p.newest[k.key] = max(p.newest[k.key], last)
		if seq > last {
			return 0, ErrReadBeyond
		}
	}
	cur, ok := p.pos[k]
	if !ok && p.reads != nil {
		var err error
		if cur, err = p.reads.ReadPosition(ctx, k.key, k.user); err != nil {
			return 0, err
		}
		cur = max(cur, p.floor[k])
		delete(p.floor, k)
		p.remember(k, cur)
	}
	if seq > cur {
		p.move(k, seq)
		p.movedTo(k.key, k.user, seq)
		return seq, nil
	}
	return cur, nil
}

func (p *positions) remember(k posKey, seq uint64) {
	if len(p.pos) >= posCacheMax {
		for c := range p.pos {
			if _, d := p.dirty[c]; !d {
				delete(p.pos, c)
			}
		}
		if len(p.newest) >= posCacheMax {
			clear(p.newest)
		}
	}
	p.pos[k] = seq
}

func (p *positions) move(k posKey, seq uint64) {
	if seq <= p.pos[k] {
		return
	}
	p.remember(k, seq)
	if _, ok := p.dirty[k]; ok {
		p.n.Stats.ReadMarksCoalesced.Add(1)
	}
	p.dirty[k] = seq
}

// flush writes the positions that moved, all in one statement. Without a
// store that keeps them (persist.Reads) the cache is the record and is
// never forgotten.
func (p *positions) flush() {
	if len(p.dirty) == 0 {
		return
	}
	if p.reads == nil {
		clear(p.dirty)
		return
	}
	p.buf = p.buf[:0]
	for k, seq := range p.dirty {
		p.buf = append(p.buf, persist.ReadMark{Key: k.key, User: k.user, Seq: seq})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := p.reads.SaveReads(ctx, p.buf)
	cancel()
	if err != nil {
		// Kept dirty: the next tick tries again.
		p.n.Stats.ReadSaveErrors.Add(1)
		return
	}
	p.n.Stats.ReadMarksWritten.Add(uint64(len(p.buf)))
	clear(p.dirty)
}

// broadcast sends the user's new position to its connections on every
// node but the marking one, through the broker (the signals' queue: at
// most once, like them). Payload: the marker's tag (8 bytes), the length
// of "app/user" (2 bytes), "app/user", then the read frame.
func (p *positions) broadcast(key, user string, seq uint64, m *Member) {
	app, room := proto.SplitKey(key)
	tag := signalBit | p.n.sigNode // the API's: no member has serial 0
	if m != nil && m.chat != nil {
		tag = m.chat.sig
	}
	b := make([]byte, 0, 10+len(app)+1+len(user)+proto.SignalFrameLen(room, "", nil)+20)
	b = binary.BigEndian.AppendUint64(b, tag)
	b = binary.BigEndian.AppendUint16(b, uint16(len(app)+1+len(user)))
	b = append(append(append(b, app...), '/'), user...)
	b = proto.AppendReadFrame(b, room, seq)
	select {
	case p.n.signals <- signalJob{key: proto.ReadKey, tag: 0, frame: b}:
	default:
		p.n.Stats.SignalsSkipped.Add(1)
	}
}

// receivedRead hands a read frame from the broker to every loop, which
// sends it to the user's connections there. Broker goroutine.
func (n *Node) receivedRead(b []byte) {
	if len(b) < 10 {
		return
	}
	tag := binary.BigEndian.Uint64(b)
	ul := int(binary.BigEndian.Uint16(b[8:]))
	if len(b) < 10+ul {
		return
	}
	userKey, frame := string(b[10:10+ul]), b[10+ul:]
	if tag&signalNodeMask != signalBit|n.sigNode {
		// Another node's: a floor for this node's answers.
		payload, _ := proto.ServerFramePayload(frame)
		if room, seq, ok := proto.ReadFrameOf(payload); ok {
			app, _, _ := strings.Cut(userKey, "/")
			_, user, _ := strings.Cut(userKey, "/")
			select {
			case n.pos.jobs <- posJob{seen: true, key: proto.RoomKey(app, room), user: user, seq: seq}:
			default:
			}
		}
	}
	mask := ^uint64(0)
	if f := n.userLoops.Load(); f != nil {
		mask = (*f)(userKey)
	}
	for i := 0; i < n.cfg.Loops; i++ {
		if mask&(1<<i) == 0 {
			continue
		}
		if t := n.tables[i].Load(); t != nil {
			t.loop.Post(Event{kind: evUserFrame, key: userKey, seq: tag, frame: frame})
		}
	}
}

// SetUserLoops gives the node the loops' index of users: f returns the
// set of loop indexes (bit i: loop i) holding a connection of user
// "app/user". A read position from the broker is then posted to those
// loops only, one lookup per position instead of one per loop; without
// it, to every loop. Any goroutine; f is called on the broker's.
func (n *Node) SetUserLoops(f func(userKey string) uint64) { n.userLoops.Store(&f) }

// SetUsers gives the table the loop's index of its users' connections:
// f appends to dst the members of user "app/user" on this loop. A read
// position reaches a user's connections through it (userFrame). The loop
// keeps that index beside its per-user counts (one pointer per
// connection), so an idle connection costs no per-loop map entry, key
// string or chat state for it. Once, before the loop runs events.
func (t *Table) SetUsers(f func(userKey string, dst []*Member) []*Member) { t.usersOf = f }

// userFrame queues frame for the connections of a user on this loop but
// the one tagged tag.
func (t *Table) userFrame(userKey string, tag uint64, frame []byte) {
	if t.usersOf == nil {
		return
	}
	t.userBuf = t.usersOf(userKey, t.userBuf[:0])
	for _, m := range t.userBuf {
		if tag == 0 || m.chat == nil || m.chat.sig != tag {
			t.enqueue(m, frame)
		}
	}
	clear(t.userBuf)
}

// readDone answers a client's read mark.
func (t *Table) readDone(ev *Event) {
	m := ev.member
	if m.Out.Closed() {
		return
	}
	if ev.frame != nil {
		t.enqueue(m, ev.frame)
		return
	}
	if ev.err != nil && !strings.Contains(ev.key, "/") { // an unread request: key is the app
		t.sendErr(m, nil, proto.CodeOverloaded, "cannot read unread counts now: retry")
		return
	}
	room := roomName(ev.key)
	switch {
	case ev.err == nil:
		a := t.arena
		t.enqueue(m, a.Keep(proto.AppendReadFrame(a.Space(32+len(room)*6), room, ev.seq)))
	case errors.Is(ev.err, ErrReadBeyond):
		t.sendErr(m, room, proto.CodeBadRequest, ev.err.Error())
	default:
		t.sendErr(m, room, proto.CodeOverloaded, "cannot store the read position now: retry")
	}
}
