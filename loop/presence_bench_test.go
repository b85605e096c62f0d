package loop

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// BenchmarkPresenceQuery10k: one presence command in a room of 10,000
// users, over the wire: the command in, the answer (count and 1000 names,
// ~10 KB) out, one at a time. ns/op is the client's round trip.
func BenchmarkPresenceQuery10k(b *testing.B) {
	b.Run("inprocess", func(b *testing.B) {
		mp := pubsub.NewMemoryPresence()
		benchPresenceQuery(b, "", "", func(pubsub.Broker) pubsub.Presence { return mp })
	})
	b.Run("redis", func(b *testing.B) {
		redistest.Require(b)
		prefix := redistest.Prefix(b)
		benchPresenceQuery(b, redistest.Addr, prefix, func(bus pubsub.Broker) pubsub.Presence {
			return bus.(*pubsub.Redis).NewPresence(pubsub.RedisPresenceConfig{Lease: 15 * time.Second, Grace: time.Second})
		})
	})
}

func benchPresenceQuery(b *testing.B, redisAddr, prefix string, mk func(pubsub.Broker) pubsub.Presence) {
	cfg := testConfig()
	parts := fanout.Parts{Store: persist.NewMemory(1000), Log: testLogger()}
	var pr pubsub.Presence
	parts.NewPresence = func(bus pubsub.Broker) (pubsub.Presence, error) { pr = mk(bus); return pr, nil }
	if redisAddr != "" {
		nb := redisBroker(nil, redisAddr, prefix) // t only for a failure to connect
		parts.NewBroker = func(h pubsub.Handler) (pubsub.Broker, error) { return nb(h), nil }
	}
	fan, err := fanout.New(cfg.Config, parts)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(cfg, fan, testLogger())
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fan.ClosePublishes()
		_ = srv.Stop(ctx)
		_ = fan.Close()
	})
	// 10,000 users, as the node's presence goroutine would apply them.
	var ch []pubsub.PresenceChange
	for i := 0; i < 10000; i++ {
		ch = append(ch, pubsub.PresenceChange{Op: pubsub.PresenceJoin, Key: "test/big", User: fmt.Sprintf("user-%05d", i)})
	}
	if _, err := pr.Apply(context.Background(), ch); err != nil {
		b.Fatal(err)
	}
	n := &node{srv: srv, fan: fan, addr: srv.Addr()}
	c := n.dial(b, "q")
	if count, users, more := c.query("big"); count != 10000 || len(users) != 1000 || !more {
		b.Fatalf("presence: %d, %d names, more %v", count, len(users), more)
	}
	// A ping's round trip on the same connection, measured alternately,
	// is the floor: what the machine's scheduling costs any command.
	var ping, query time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		c.send(`{"op":"ping"}`)
		c.recvRaw()
		t1 := time.Now()
		c.send(`{"op":"presence","room":"big"}`)
		c.recvRaw()
		query += time.Since(t1)
		ping += t1.Sub(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(query.Microseconds())/float64(b.N), "µs/query")
	b.ReportMetric(float64(ping.Microseconds())/float64(b.N), "µs/ping")
}
