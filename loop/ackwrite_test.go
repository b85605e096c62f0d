package loop

import (
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

// TestAnswerSkipsTheTick: the answer to a request (history, read, unread)
// leaves at the end of the wake-up that brought it, not at the next flush
// tick, even on a connection written in this tick's period. With a tick of
// a second, an answer that waited for it would come ~1 s after the
// connection's last write.
func TestAnswerSkipsTheTick(t *testing.T) {
	n := startNode(t, func(c *Config) { c.FlushInterval = time.Second })
	a := n.dial(t, "alice")
	for _, req := range []string{
		`{"op":"history","room":"r"}`,
		`{"op":"read","room":"r","seq":1}`,
		`{"op":"unread","rooms":["r"]}`,
	} {
		// A publish: its msg and ack are written at once, and the loop
		// ticks from there.
		a.send(`{"op":"pub","room":"r","id":"` + req[7:11] + `","body":1}`)
		a.expect(map[string]any{"op": "ack"})
		start := time.Now()
		a.send(req)
		got := a.recv()
		took := time.Since(start)
		t.Logf("%s: %v", req, took)
		if took > 600*time.Millisecond {
			t.Fatalf("%s: answer %v came after %v, the flush tick's wait", req, got["op"], took)
		}
	}
}
