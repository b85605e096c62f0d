package loop

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/pubsub"
)

// flakyBroker fails the first publish of every seq, as a broker does when
// its connection drops between two publishes.
type flakyBroker struct {
	*pubsub.Memory
	mu   sync.Mutex
	seen map[uint64]bool
}

func (b *flakyBroker) Publish(ctx context.Context, key string, seq uint64, frame []byte) error {
	b.mu.Lock()
	first := !b.seen[seq]
	b.seen[seq] = true
	b.mu.Unlock()
	if first {
		return errors.New("connection reset")
	}
	return b.Memory.Publish(ctx, key, seq, frame)
}

// PublishBatch fails as Publish does, message by message.
func (b *flakyBroker) PublishBatch(ctx context.Context, pubs []pubsub.Publication, errs []error) int {
	failed := 0
	for i := range pubs {
		if errs[i] = b.Publish(ctx, pubs[i].Key, pubs[i].Seq, pubs[i].Frame); errs[i] != nil {
			failed++
		}
	}
	return failed
}

// A failed broadcast reaches the members of a room that then goes quiet:
// no later message is needed to notice the gap.
func TestFailedBroadcastIsRetried(t *testing.T) {
	n := startNodeWith(t, testConfig(), persist.NewMemory(100), testLogger(), func(h pubsub.Handler) pubsub.Broker {
		return &flakyBroker{Memory: pubsub.NewMemory(h), seen: map[uint64]bool{}}
	})
	sub := n.dial(t, "sub")
	sub.send(`{"op":"join","room":"quiet"}`)
	sub.expect(map[string]any{"op": "joined", "seq": 0})
	pub := n.dial(t, "pub")
	pub.send(`{"op":"pub","room":"quiet","id":"only","body":"x"}`)
	pub.expect(map[string]any{"op": "ack", "seq": 1}) // committed, so acked
	sub.expect(map[string]any{"op": "msg", "seq": 1, "id": "only"})
	// The retry counts itself after its publish returns, which may be just
	// after the member read the message.
	checkFor(t, 2*time.Second, func() bool { return n.fan.Stats.Rebroadcasts.Load() == 1 })
	if got := n.fan.Stats.BrokerErrors.Load(); got != 1 {
		t.Fatalf("broker errors %d, want 1", got)
	}
}
