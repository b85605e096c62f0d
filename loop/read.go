package loop

import (
	"context"
	"errors"
	"time"

	"github.com/roost-chat/roost/fanout"
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

// readJob is a store read for a loop. Store reads may take milliseconds
// (PostgreSQL), so they never run on a loop: a small pool of reader
// goroutines does them and posts the result to the loop's inbox.
type readJob struct {
	kind   readKind
	loop   *loopState
	conn   *conn
	room   *fanout.Room
	key    string
	after  uint64
	upto   uint64
	before uint64
	limit  int
}

const readTimeout = 10 * time.Second

// read queues a store read without blocking the loop. A full queue answers
// at once rather than stall every connection of the loop.
func (s *Server) read(j readJob) {
	select {
	case s.reads <- j:
	default:
		s.Stats.Overloaded.Add(1)
		j.loop.push(j.failed(proto.ErrOverloaded))
	}
}

func (j *readJob) failed(err error) task {
	switch j.kind {
	case rLastSeq:
		return task{kind: tRoomSeq, room: j.room, err: err}
	case rReplay:
		return task{kind: tReplay, conn: j.conn, room: j.room, err: err}
	case rHistory:
		return task{kind: tHistory, conn: j.conn, key: j.key, err: err}
	default:
		return task{kind: tRepair, room: j.room, seq: j.upto, n: j.tailFlag(), err: err}
	}
}

// tailFlag marks a repair task as a tail read (asked with upto 0).
func (j *readJob) tailFlag() uint64 {
	if j.kind == rRepair && j.upto == 0 {
		return 1
	}
	return 0
}

func (s *Server) reader() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case j := <-s.reads:
			j.loop.push(s.doRead(&j))
		}
	}
}

func (s *Server) doRead(j *readJob) task {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	switch j.kind {
	case rLastSeq:
		seq, err := s.store.LastSeq(ctx, j.key)
		if err != nil {
			return j.failed(err)
		}
		return task{kind: tRoomSeq, room: j.room, seq: seq}
	case rReplay:
		msgs, more, err := s.store.Range(ctx, j.key, j.after, j.upto, persist.Bounds{Limit: replayPage})
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
		return task{kind: tReplay, conn: j.conn, room: j.room, frame: buf, seq: cursor}
	case rHistory:
		msgs, _, err := s.store.History(ctx, j.key, j.before, persist.Bounds{Limit: j.limit})
		if err != nil {
			return j.failed(err)
		}
		_, room := proto.SplitKey(j.key)
		return task{kind: tHistory, conn: j.conn, key: j.key, frame: proto.AppendHistoryFrame(nil, []byte(room), msgs)}
	case rRepair:
		upto := j.upto
		if upto == 0 {
			last, err := s.store.LastSeq(ctx, j.key)
			if err != nil {
				return j.failed(err)
			}
			upto = last
		}
		if upto <= j.after {
			return task{kind: tRepair, room: j.room, seq: upto, n: j.tailFlag()}
		}
		msgs, _, err := s.store.Range(ctx, j.key, j.after, upto, persist.Bounds{Limit: int(min(upto-j.after, 10000))})
		if err != nil {
			return j.failed(err)
		}
		held := make([]fanout.Held, len(msgs))
		for i := range msgs {
			m := &msgs[i]
			held[i] = fanout.Held{Seq: m.Seq, Frame: proto.AppendMsgFrame(nil, m.Room, m.Seq, []byte(m.ID), m.From, m.TS, m.Body)}
		}
		return task{kind: tRepair, room: j.room, held: held, seq: upto, n: j.tailFlag()}
	}
	return j.failed(errors.New("BUG: unknown read"))
}
