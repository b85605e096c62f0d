package fanout

import (
	"context"
	"errors"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

type readKind uint8

const (
	rLastSeq readKind = iota + 1 // a room became wanted: its newest seq
	rReplay                      // a join with since: one page of catch-up
	rHistory                     // a history command
	rRepair                      // a gap (upto > 0) or a broker reset (upto == 0)
)

// replayPage bounds one catch-up read: a client far behind is caught up a
// page at a time, each page flushed before the next, under the outbound limit.
const replayPage = 500

// What the replay share keeps of the catch-up reads: long enough for the
// rejoins of a reconnect storm (clients retry within a few seconds), at
// most 4,096 rooms of 4 MiB.
const (
	replayKeep  = 3 * time.Second
	replayRooms = 4096
	replayBytes = 4 << 20
)

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
}

const readTimeout = 10 * time.Second

// read queues a store read without blocking the loop. A full queue answers
// at once rather than stall every connection of the loop.
func (n *Node) read(j readJob) {
	select {
	case n.reads <- j:
	default:
		n.Stats.ReadsRefused.Add(1)
		j.table.loop.Post(j.failed(proto.ErrOverloaded))
	}
}

func (j *readJob) failed(err error) Event {
	switch j.kind {
	case rLastSeq:
		return Event{kind: evRoomSeq, room: j.room, err: err}
	case rReplay:
		return Event{kind: evReplay, member: j.member, room: j.room, err: err}
	case rHistory:
		return Event{kind: evHistory, member: j.member, key: j.key, err: err}
	default:
		return Event{kind: evRepair, room: j.room, upto: j.upto, tail: j.tail(), err: err}
	}
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
			j.table.loop.Post(n.doRead(&j))
		}
	}
}

func (n *Node) doRead(j *readJob) Event {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	switch j.kind {
	case rLastSeq:
		seq, err := n.store.LastSeq(ctx, j.key)
		if err != nil {
			return j.failed(err)
		}
		return Event{kind: evRoomSeq, room: j.room, seq: seq}
	case rReplay:
		msgs, more, err := n.replays.Range(ctx, j.key, j.after, j.upto, persist.Bounds{Limit: replayPage})
		if err != nil {
			return j.failed(err)
		}
		var buf []byte
		for i := range msgs {
			m := &msgs[i]
			buf = proto.AppendMsgFrame(buf, m.Room, m.Seq, []byte(m.ID), m.From, m.TS, m.Body)
		}
		// The cursor moves to the last message read, or to upto when the
		// page was not full (nothing more is stored up to upto).
		cursor := j.upto
		if more {
			cursor = msgs[len(msgs)-1].Seq
		}
		return Event{kind: evReplay, member: j.member, room: j.room, frame: buf, cursor: cursor}
	case rHistory:
		msgs, _, err := n.store.History(ctx, j.key, j.before, persist.Bounds{Limit: j.limit})
		if err != nil {
			return j.failed(err)
		}
		_, room := proto.SplitKey(j.key)
		return Event{kind: evHistory, member: j.member, key: j.key, frame: proto.AppendHistoryFrame(nil, []byte(room), msgs)}
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
		msgs, _, err := n.store.Range(ctx, j.key, j.after, upto, persist.Bounds{Limit: int(min(upto-j.after, 10000))})
		if err != nil {
			return j.failed(err)
		}
		held := make([]Held, len(msgs))
		for i := range msgs {
			m := &msgs[i]
			held[i] = Held{Seq: m.Seq, Frame: proto.AppendMsgFrame(nil, m.Room, m.Seq, []byte(m.ID), m.From, m.TS, m.Body)}
		}
		return Event{kind: evRepair, room: j.room, held: held, upto: upto, tail: j.tail()}
	}
	return j.failed(errors.New("BUG: unknown read"))
}
