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
