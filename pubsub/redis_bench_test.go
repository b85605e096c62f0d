package pubsub

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// benchHandler counts deliveries and, for the serial case, signals each.
type benchHandler struct {
	n      atomic.Int64
	signal chan struct{}
}

func (h *benchHandler) OnMessage(key string, seq uint64, frame []byte) {
	h.n.Add(1)
	if h.signal != nil {
		h.signal <- struct{}{}
	}
}

func (h *benchHandler) OnReset() {}

// BenchmarkRedisPublishDeliver measures publish on node A → OnMessage on
// node B through the real Redis. serial is one message in flight (the
// round trip); parallel has one publisher goroutine per room, which
// rueidis pipelines into shared writes.
func BenchmarkRedisPublishDeliver(b *testing.B) {
	redistest.Require(b)
	const rooms = 64
	for _, size := range []int{128, 1024} {
		frame := make([]byte, size)
		b.Run(fmt.Sprintf("serial/%dB", size), func(b *testing.B) {
			cfg := RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(b)}
			h := &benchHandler{signal: make(chan struct{}, 1)}
			pub := newTestRedis(b, cfg, &benchHandler{})
			sub := newTestRedis(b, cfg, h)
			subscribeWait(b, sub, "bench")
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				if err := pub.Publish(ctx, "bench", uint64(i), frame); err != nil {
					b.Fatal(err)
				}
				<-h.signal
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("parallel/%dB", size), func(b *testing.B) {
			cfg := RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(b)}
			h := &benchHandler{}
			pub := newTestRedis(b, cfg, &benchHandler{})
			sub := newTestRedis(b, cfg, h)
			for i := range rooms {
				subscribeWait(b, sub, fmt.Sprint("bench", i))
			}
			ctx := context.Background()
			var next atomic.Int64
			b.SetParallelism(4)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// One room per goroutine keeps the one-publisher-per-room
				// contract.
				id := next.Add(1) - 1
				if id >= rooms {
					panic("BUG: more publishers than subscribed rooms")
				}
				key := fmt.Sprint("bench", id)
				var seq uint64
				for pb.Next() {
					seq++
					if err := pub.Publish(ctx, key, seq, frame); err != nil {
						b.Error(err)
						return
					}
				}
			})
			// Count the work as done only once every message arrived.
			deadline := time.Now().Add(10 * time.Second)
			for h.n.Load() < int64(b.N) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			b.StopTimer()
			if got := h.n.Load(); got != int64(b.N) {
				b.Fatalf("delivered %d of %d", got, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func BenchmarkRedisPublish(b *testing.B) {
	redistest.Require(b)
	r := newTestRedis(b, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(b)}, &benchHandler{})
	frame := make([]byte, 128)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := range b.N {
		if err := r.Publish(ctx, "nobody", uint64(i), frame); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedisPublishBatch publishes a commit batch of 64 messages as
// the pool's sink does: one PublishBatch (one pipelined round trip), or
// one Publish after the other (a round trip each). ns/op is per message.
func BenchmarkRedisPublishBatch(b *testing.B) {
	redistest.Require(b)
	r := newTestRedis(b, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(b)}, &benchHandler{})
	frame := make([]byte, 128)
	ctx := context.Background()
	const batch = 64
	pubs := make([]Publication, batch)
	errs := make([]error, batch)
	for i := range pubs {
		pubs[i] = Publication{Key: fmt.Sprint("room", i%8), Frame: frame}
	}
	b.Run("PublishBatch", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		for i := 0; i < b.N; i += batch {
			n := min(batch, b.N-i)
			for j := range n {
				pubs[j].Seq = uint64(i + j)
			}
			if r.PublishBatch(ctx, pubs[:n], errs) != 0 {
				b.Fatal(errs)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("PublishEach", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		for i := range b.N {
			if err := r.Publish(ctx, pubs[i%batch].Key, uint64(i), frame); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
