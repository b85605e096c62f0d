package loop

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/fanout"
)

// countObs counts observations.
type countObs struct{ n atomic.Int64 }

func (o *countObs) Observe(float64) { o.n.Add(1) }

// TestAckSkipsTheTick: an ack is written at the end of the wake-up that
// queued it, even on a connection written in this tick's period (its own
// message's delivery just went out) and even while the loop holds its
// output for its publishes in flight; other output still waits for the
// tick. Its write-out is observed once.
func TestAckSkipsTheTick(t *testing.T) {
	rig := newFanoutRig(t, 3, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself
	t.Cleanup(l.stopTimers)
	wrote := &countObs{}
	l.srv.Stats.AckWrite = wrote
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }
	rig.next()
	ms := append([]*connOut(nil), l.q.TakeFresh()...) // the three members
	l.kick()
	if writes() != 3 || !l.ticking {
		t.Fatalf("after a pause: %d writes, ticking %v", writes(), l.ticking)
	}
	pub := ms[0].Owner.(*conn)
	ack := func(id string) {
		req := fanout.GetPubRequest()
		req.Key, req.From = rig.key, "u"
		req.ID = append(req.ID, id...)
		ps := l.stamp(pub, req)
		ps.seq = 9
		l.ack(ps)
	}

	// Written in this period: another member's output waits, the ack goes.
	l.q.Enqueue(ms[1], []byte("x"))
	ack("a1")
	l.kick()
	if writes() != 4 || ms[0].PendingBytes() != 0 || ms[1].PendingBytes() == 0 {
		t.Fatalf("ack on a connection written in the period: %d writes, pending ack %d, other %d; want the ack written and the other held",
			writes(), ms[0].PendingBytes(), ms[1].PendingBytes())
	}
	if wrote.n.Load() != 1 || len(l.acksOut) != 0 {
		t.Fatalf("write-out observed %d times, %d acks still tracked; want 1 and 0", wrote.n.Load(), len(l.acksOut))
	}
	l.tick()
	l.tick() // quiet: the loop stops ticking
	if l.ticking {
		t.Fatal("quiet tick did not stop the ticking")
	}

	// Held for the loop's publishes in flight: the ack goes anyway.
	l.inflight++ // another publish of the loop in the pool
	rig.next()
	ack("a2")
	l.kick()
	if !l.holding || ms[0].PendingBytes() != 0 || ms[1].PendingBytes() == 0 {
		t.Fatalf("ack during a hold: holding %v, pending ack %d, other %d; want the ack written and the rest held",
			l.holding, ms[0].PendingBytes(), ms[1].PendingBytes())
	}
	l.inflight--
	if wrote.n.Load() != 2 {
		t.Fatalf("write-out observed %d times, want 2", wrote.n.Load())
	}
}

// TestAnswerSkipsTheTick: the answer to a request (history, presence,
// read, unread, receipts) is written by the wake-up that runs it (its
// closing kick), not at the next flush tick, even on a connection written
// in this tick's period, while other output held for the tick stays held.
// The tick is armed but its timer stopped: only the wake-up can write.
func TestAnswerSkipsTheTick(t *testing.T) {
	rig := newFanoutRig(t, 2, false)
	l := rig.l
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }
	rig.next()
	ms := append([]*connOut(nil), l.q.TakeFresh()...) // the two members
	asker := &ms[0].Owner.(*conn).m
	l.kick()
	l.flushT.stop()
	if writes() != 2 || !l.ticking {
		t.Fatalf("after a pause: %d writes, ticking %v", writes(), l.ticking)
	}
	for _, req := range []struct {
		name     string
		ask      func() error
		gathered bool // a read positions request: handed over at the end of the wake-up that read it
	}{
		{"history", func() error { return l.table.History(asker, rig.key, 0, 10) }, false},
		{"presence", func() error { return l.table.Presence(asker, rig.key) }, false},
		{"read", func() error { return refusedErr(l.table.MarkRead(asker, rig.key, "u", 0)) }, true},
		{"unread", func() error { return refusedErr(l.table.Unread(asker, "app", "u", []string{"room"})) }, true},
		{"receipts", func() error { return refusedErr(l.table.Receipts(asker, rig.key)) }, true},
	} {
		l.q.Enqueue(ms[1], []byte("x")) // waits for the tick
		if err := req.ask(); err != nil {
			t.Fatal(req.name, err)
		}
		if req.gathered {
			if !rig.el.pending.Load() {
				t.Fatalf("%s: no flush of the read positions' requests queued", req.name)
			}
			rig.runInbox()
		}
		// The answer comes from fanout's goroutines through the inbox.
		deadline := time.Now().Add(5 * time.Second)
		for !rig.el.pending.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no answer posted", req.name)
			}
			time.Sleep(time.Millisecond)
		}
		before := writes()
		rig.runInbox()
		if ms[0].PendingBytes() == 0 || writes() != before {
			t.Fatalf("%s: after the wake-up's events: answer pending %d B, %d writes; want it queued, none written",
				req.name, ms[0].PendingBytes(), writes()-before)
		}
		l.kick()
		if ms[0].PendingBytes() != 0 || ms[1].PendingBytes() == 0 || writes() != before+1 || !l.ticking {
			t.Fatalf("%s: after the wake-up's kick: answer pending %d B, held %d B, %d writes, ticking %v; want the answer alone written in one write",
				req.name, ms[0].PendingBytes(), ms[1].PendingBytes(), writes()-before, l.ticking)
		}
		if !l.q.WroteInPeriod(ms[0]) {
			t.Fatalf("%s: asker not written in the period", req.name)
		}
	}
}

// TestReadAnswersTogether: read marks read from several connections in
// one wake-up go to the positions goroutine together (one flush task on
// the loop's inbox, not one hand-over and one wake-up of that goroutine
// each), and their answers come back together: one wake-up of the loop,
// whose kick writes them all in one round, one write per connection.
func TestReadAnswersTogether(t *testing.T) {
	const n = 8
	rig := newFanoutRig(t, n, false)
	l := rig.l
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }
	rig.next()
	ms := append([]*connOut(nil), l.q.TakeFresh()...)
	l.kick()
	l.flushT.stop()
	if len(ms) != n {
		t.Fatalf("%d members written, want %d", len(ms), n)
	}
	queued := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.queue)
	}
	for i, o := range ms {
		if !l.table.MarkRead(&o.Owner.(*conn).m, rig.key, "u"+strconv.Itoa(i), 0) {
			t.Fatal("mark refused", i)
		}
	}
	if q := queued(); q != 1 || !rig.el.pending.Load() {
		t.Fatalf("%d marks queued %d tasks (pending %v), want one flush", n, q, rig.el.pending.Load())
	}
	rig.runInbox()
	deadline := time.Now().Add(5 * time.Second)
	for !rig.el.pending.Load() {
		if time.Now().After(deadline) {
			t.Fatal("no answer posted")
		}
		time.Sleep(time.Millisecond)
	}
	if q := queued(); q != n {
		t.Fatalf("the answers' first wake-up holds %d of them, want all %d", q, n)
	}
	before := writes()
	rig.runInbox()
	l.kick()
	if w := writes() - before; w != n {
		t.Fatalf("the answers' wake-up wrote %d times, want %d", w, n)
	}
	for i, o := range ms {
		if o.PendingBytes() != 0 {
			t.Fatalf("member %d: %d B still pending", i, o.PendingBytes())
		}
	}
}

// refusedErr is the error of a request the queue refused (false).
func refusedErr(queued bool) error {
	if !queued {
		return errors.New("queue full")
	}
	return nil
}
