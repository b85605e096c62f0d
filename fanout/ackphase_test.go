package fanout

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// slowCommits is the memory store with commits that take at least d, and
// that say when each begins.
type slowCommits struct {
	persist.Store
	d       time.Duration
	started chan struct{}
}

func (s *slowCommits) CommitBatch(ctx context.Context, rows []*persist.Row) error {
	select {
	case s.started <- struct{}{}:
	default:
	}
	time.Sleep(s.d)
	return s.Store.CommitBatch(ctx, rows)
}

// phaseLog records every observation of one phase.
type phaseLog struct {
	mu sync.Mutex
	v  []float64
}

func (p *phaseLog) Observe(v float64) {
	p.mu.Lock()
	p.v = append(p.v, v)
	p.mu.Unlock()
}

// stampSink keeps each answered request's stamps (the request itself goes
// back to the pool only at the end).
type stampSink struct {
	mu   sync.Mutex
	reqs map[string]PubRequest
	done chan struct{}
}

func (s *stampSink) Published(req *PubRequest) {
	s.mu.Lock()
	s.reqs[string(req.ID)] = *req
	s.mu.Unlock()
	s.done <- struct{}{}
}

// TestAckPhasesSplitAnAck: each answered publish gets one observation per
// phase, its stamps are in the order the publish passes them, and each
// phase holds the wait it is named for: a publish taken while the
// previous batch commits waits that commit out in "pipeline", and every
// publish spends at least the store's commit time in "commit".
func TestAckPhasesSplitAnAck(t *testing.T) {
	const commitTime = 30 * time.Millisecond
	st := &slowCommits{Store: persist.NewMemory(100), d: commitTime, started: make(chan struct{}, 1)}
	logs := make([]*phaseLog, 6)
	for i := range logs {
		logs[i] = &phaseLog{}
	}
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 1, GapWindow: 10 * time.Millisecond},
		Parts{Store: st, Pool: PoolConfig{Window: -1}})
	if err != nil {
		t.Fatal(err)
	}
	// Before the first publish, which the workers take through a channel.
	n.Stats.AckPhases = AckPhases{Queue: logs[0], Pipeline: logs[1], Window: logs[2], Commit: logs[3], Answer: logs[4], Broker: logs[5]}
	defer n.Close()
	sink := &stampSink{reqs: map[string]PubRequest{}, done: make(chan struct{}, 8)}
	pub := func(id string) {
		req := GetPubRequest()
		req.Key, req.From, req.Origin = proto.RoomKey("app", "r"), "alice", sink
		req.ID = append(req.ID, id...)
		req.Body = append(req.Body, `"hi"`...)
		if err := n.Publish(req); err != nil {
			t.Fatal(err)
		}
	}
	pub("first")
	<-st.started // the first publish's commit is in flight
	pub("second")
	for range 2 {
		select {
		case <-sink.done:
		case <-time.After(5 * time.Second):
			t.Fatal("publishes not answered")
		}
	}
	for i, l := range logs {
		if len(l.v) != 2 {
			t.Fatalf("phase %d observed %d times, want once per publish (2)", i, len(l.v))
		}
	}
	for _, id := range []string{"first", "second"} {
		r := sink.reqs[id]
		st := []time.Duration{r.Entered, r.Taken, r.Idle, r.Handed, r.CommitEnd, r.BrokerAt, r.Answered}
		for i := 1; i < len(st); i++ {
			if st[i] < st[i-1] {
				t.Fatalf("%s: stamp %d (%v) before stamp %d (%v): %v", id, i, st[i], i-1, st[i-1], st)
			}
		}
		if c := r.CommitEnd - r.Handed; c < commitTime {
			t.Errorf("%s: commit phase %v, shorter than the store's %v", id, c, commitTime)
		}
		if r.Err != nil || r.Seq == 0 {
			t.Errorf("%s: seq %d err %v", id, r.Seq, r.Err)
		}
	}
	second := sink.reqs["second"]
	if w := second.Idle - second.Taken; w < commitTime/2 {
		t.Errorf("second publish waited %v for the commit in flight (pipeline), want most of %v", w, commitTime)
	}
	t.Logf("second publish: queue %v pipeline %v window %v commit %v answer %v broker %v",
		second.Taken-second.Entered, second.Idle-second.Taken, second.Handed-second.Idle,
		second.CommitEnd-second.Handed, second.BrokerAt-second.CommitEnd, second.Answered-second.BrokerAt)
}
