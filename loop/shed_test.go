package loop

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
)

// slowStore holds every commit for delay first: a node whose publishes wait
// that long from read to commit, as under CPU overload.
type slowStore struct {
	persist.Store
	delay atomic.Int64
}

func (s *slowStore) CommitBatch(ctx context.Context, rows []*persist.Row) error {
	time.Sleep(time.Duration(s.delay.Load()))
	return s.Store.CommitBatch(ctx, rows)
}

// TestShedWhileCommitsLag: once a loop's publishes take longer than
// ShedAfter from read to commit, a publish that arrives while others wait is
// answered err overloaded and not stored; when commits are quick again the
// loop takes publishes again.
func TestShedWhileCommitsLag(t *testing.T) {
	store := &slowStore{Store: persist.NewMemory(1000)}
	store.delay.Store(int64(400 * time.Millisecond))
	cfg := testConfig()
	cfg.Loops = 1
	cfg.ShedAfter = 100 * time.Millisecond
	n := startNodeWith(t, cfg, store, testLogger(), nil)
	c := n.dial(t, "alice")
	// three slow commits, one at a time: the smoothed lag passes 100 ms
	// (400 ms × (1 - (7/8)^3) = 133 ms), but with nothing else waiting
	// none is refused
	for _, id := range []string{"a1", "a2", "a3"} {
		c.send(`{"op":"pub","room":"r","id":"` + id + `","body":1}`)
		c.expect(map[string]any{"op": "ack", "id": id})
	}
	// b1 waits for its commit; b2 arrives meanwhile and is shed
	c.send(`{"op":"pub","room":"r","id":"b1","body":1}`)
	c.send(`{"op":"pub","room":"r","id":"b2","body":2}`)
	c.expect(map[string]any{"op": "err", "code": "overloaded", "ref": "b2"})
	c.expect(map[string]any{"op": "ack", "id": "b1", "seq": 4})
	if got := n.srv.Stats.Shed.Load(); got != 1 {
		t.Fatalf("shed %d, want 1", got)
	}
	// commits are quick again: with nothing in flight a publish is taken,
	// and a few quick acks bring the lag under the bound
	store.delay.Store(0)
	for i, id := range []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"} {
		c.send(`{"op":"pub","room":"r","id":"` + id + `","body":1}`)
		c.expect(map[string]any{"op": "ack", "id": id, "seq": 5 + i})
	}
	// now publishes in flight together are all taken; b2, retried with its
	// id, is stored once, after the others
	c.send(`{"op":"pub","room":"r","id":"d1","body":1}`)
	c.send(`{"op":"pub","room":"r","id":"b2","body":2}`)
	c.expect(map[string]any{"op": "ack", "id": "d1", "seq": 14})
	c.expect(map[string]any{"op": "ack", "id": "b2", "seq": 15})
	if got := n.srv.Stats.Shed.Load(); got != 1 {
		t.Fatalf("shed %d after recovery, want 1", got)
	}
}

func TestSheddingRule(t *testing.T) {
	cfg := Defaults()
	cfg.ShedAfter = 100 * time.Millisecond
	l := &loopState{srv: &Server{cfg: cfg}}
	for _, tc := range []struct {
		inflight int
		lag      time.Duration
		shed     bool
	}{
		{0, time.Hour, false}, // nothing waiting: take one to measure again
		{1, 50 * time.Millisecond, false},
		{1, 101 * time.Millisecond, true},
		{9, time.Second, true},
	} {
		l.inflight, l.commitLag = tc.inflight, tc.lag
		if got := l.shedding(); got != tc.shed {
			t.Fatalf("in flight %d, lag %v: shedding %v", tc.inflight, tc.lag, got)
		}
	}
	l.srv.cfg.ShedAfter = 0
	l.inflight, l.commitLag = 9, time.Hour
	if l.shedding() {
		t.Fatal("ShedAfter 0 sheds")
	}
}
