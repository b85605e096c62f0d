package fanout

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

type readKind uint8

const (
	rLastSeq  readKind = iota + 1 // a room became wanted: its newest seq
	rReplay                       // a join with since: one page of catch-up
	rHistory                      // a history command
	rRepair                       // a gap (upto > 0) or a broker reset (upto == 0)
	rPresence                     // a presence command
)

// replayPage bounds one catch-up read by count (pageBytes bounds it by
// size): a client far behind is caught up a page at a time, each read once
// the previous one has left.
const replayPage = 500

// What the replay share keeps of the catch-up reads: long enough for the
// rejoins of a reconnect storm (clients retry within a few seconds), at
// most 4,096 rooms of 4 MiB.
const (
	replayKeep  = 3 * time.Second
	replayRooms = 4096
	replayBytes = 4 << 20
)

// repairPages bounds one gap or tail repair read, in replay pages: the
// members get what was missing in steps, the next one once they have taken
// most of this one (CheckGaps, pumpTails).
const repairPages = 4

// readJob is a store read for a loop's Table. Store reads may take
// milliseconds (PostgreSQL), so they never run on a loop: a small pool of
// reader goroutines does them and posts the result to the loop.
type readJob struct {
	kind   readKind
	table  *Table
	member *Member
	room   *Room
	key    string
	after  uint64
	upto   uint64
	before uint64
	limit  int
	// first: the first page of a join with since (after is since; see
	// startJoin); other: the client's epoch is not the room's.
	first, other bool
	// forward, fold (rHistory): HistoryQuery's.
	forward, fold bool
}

// Flags of an evReplay or evRepair Event.
const (
	readAhead    uint8 = 1 << iota // since is not past the store's newest seq: wait, nothing read
	readOther                      // the client's seqs belong to another history: the page starts at the oldest stored
	readMore                       // a repair stopped at its bounds: more follows
	readPresence                   // evHistory: the answer of a presence command
)

const readTimeout = 10 * time.Second

// read queues a store read without blocking the loop. A full queue answers
// at once rather than stall every connection of the loop (a catch-up page
// waits instead: Table.pump).
func (n *Node) read(j readJob) {
	if !n.tryRead(j) {
		n.Stats.ReadsRefused.Add(1)
		j.table.loop.Post(j.failed(proto.ErrOverloaded))
	}
}

// tryRead queues a store read unless the queue is full.
func (n *Node) tryRead(j readJob) bool {
	select {
	case n.reads <- j:
		return true
	default:
		return false
	}
}

func (j *readJob) failed(err error) Event {
	switch j.kind {
	case rLastSeq:
		return Event{kind: evRoomSeq, room: j.room, err: err}
	case rReplay:
		return Event{kind: evReplay, member: j.member, room: j.room, err: err}
	case rHistory, rPresence:
		return Event{kind: evHistory, member: j.member, key: j.key, err: err, flags: j.flags()}
	default:
		return Event{kind: evRepair, room: j.room, upto: j.upto, tail: j.tail(), err: err}
	}
}

// flags marks a presence answer (evHistory carries both).
func (j *readJob) flags() uint8 {
	if j.kind == rPresence {
		return readPresence
	}
	return 0
}

// tail reports whether a repair is a tail read (asked with upto 0).
func (j *readJob) tail() bool { return j.kind == rRepair && j.upto == 0 }

func (n *Node) reader() {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case j := <-n.reads:
			if j.member != nil && j.member.readQ() != nil && j.member.readQ().gone.Load() {
				// Its connection is gone: build nothing for it.
				j.table.loop.Post(j.failed(proto.ErrClosed))
				continue
			}
			j.table.loop.Post(n.doRead(&j))
		}
	}
}

func (n *Node) doRead(j *readJob) Event {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	switch j.kind {
	case rLastSeq:
		h, err := n.store.Head(ctx, j.key)
		if err != nil {
			return j.failed(err)
		}
		return Event{kind: evRoomSeq, room: j.room, seq: h.Last, epoch: h.Epoch}
	case rReplay:
		after := j.after
		var flags uint8
		if j.first {
			if !j.other && j.after > j.upto {
				// Past this loop's newest seq: in flight through the broker,
				// or another history? The store knows.
				h, err := n.store.Head(ctx, j.key)
				if err != nil {
					return j.failed(err)
				}
				if j.after <= h.Last {
					return Event{kind: evReplay, member: j.member, room: j.room, flags: readAhead}
				}
				j.other = true
			}
			if j.other {
				flags |= readOther
				after = 0
			}
		}
		var msgs []proto.Message
		more := false
		if after < j.upto {
			var err error
			msgs, more, err = n.replays.Range(ctx, j.key, after, j.upto, persist.Bounds{Limit: replayPage, MaxBytes: n.pageBytes()})
			if err != nil {
				return j.failed(err)
			}
		}
		var buf []byte
		for i := range msgs {
			buf = proto.AppendMsgMessageFrame(buf, &msgs[i])
		}
		// The cursor moves to the last message read, or to upto when the
		// read got to the end (nothing more is stored up to upto); first is
		// the first seq read (0: none), which tells a gap.
		ev := Event{kind: evReplay, member: j.member, room: j.room, frame: buf, cursor: j.upto, flags: flags}
		if more {
			ev.cursor = msgs[len(msgs)-1].Seq
		}
		if len(msgs) > 0 {
			ev.seq = msgs[0].Seq
		}
		return ev
	case rHistory:
		b := persist.Bounds{Limit: j.limit, MaxBytes: n.pageBytes()}
		var msgs []proto.Message
		var more bool
		var err error
		switch {
		case j.fold:
			f, ok := n.store.(persist.Folder)
			if !ok {
				return j.failed(errors.New("the store cannot fold history"))
			}
			msgs, more, err = f.Fold(ctx, j.key, persist.FoldQuery{Before: j.before, After: j.after, Forward: j.forward}, b)
		case j.forward:
			msgs, more, err = n.store.Range(ctx, j.key, j.after, math.MaxUint64, b)
		default:
			msgs, more, err = n.store.History(ctx, j.key, j.before, b)
		}
		if err != nil {
			return j.failed(err)
		}
		_, room := proto.SplitKey(j.key)
		// more, on the wire, says the answer stopped at its byte bound.
		frame := proto.AppendHistoryFrame(nil, []byte(room), msgs, more && len(msgs) < j.limit)
		return Event{kind: evHistory, member: j.member, key: j.key, frame: frame}
	case rPresence:
		frame, err := n.pres.answer(ctx, j.key)
		if err != nil {
			return j.failed(err)
		}
		return Event{kind: evHistory, member: j.member, key: j.key, frame: frame, flags: readPresence}
	case rRepair:
		upto := j.upto
		if upto == 0 {
			last, err := n.store.LastSeq(ctx, j.key)
			if err != nil {
				return j.failed(err)
			}
			upto = last
		}
		if upto <= j.after {
			return Event{kind: evRepair, room: j.room, upto: upto, tail: j.tail()}
		}
		msgs, more, err := n.store.Range(ctx, j.key, j.after, upto, persist.Bounds{Limit: int(min(upto-j.after, 10000)), MaxBytes: repairPages * n.pageBytes()})
		if err != nil {
			return j.failed(err)
		}
		held := make([]Held, len(msgs))
		for i := range msgs {
			m := &msgs[i]
			held[i] = Held{Seq: m.Seq, Frame: proto.AppendMsgMessageFrame(nil, m)}
		}
		ev := Event{kind: evRepair, room: j.room, held: held, upto: upto, tail: j.tail()}
		if more {
			ev.flags = readMore
		}
		return ev
	}
	return j.failed(errors.New("BUG: unknown read"))
}
