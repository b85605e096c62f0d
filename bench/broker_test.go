//go:build linux

package bench

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// The broker scenario carries every message to every subscribing broker and
// reads Redis's CPU: a short run with three brokers as three nodes.
func TestBrokerBench(t *testing.T) {
	redistest.Require(t)
	p := brokerParams{redisURL: "redis://" + redistest.Addr, nodes: 3, rooms: 10, rate: 500, size: 200,
		batch: 10 * time.Millisecond, warmup: 200 * time.Millisecond, dur: time.Second}
	res, err := runBroker(context.Background(), p, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.Published < 300 || res.Missing != 0 || res.PublishErrors != 0 {
		t.Fatalf("published %d, missing %d, publish errors %d", res.Published, res.Missing, res.PublishErrors)
	}
	if res.Delivered < res.Published*2 {
		t.Fatalf("delivered %d in the window for %d published to 3 nodes", res.Delivered, res.Published)
	}
	if res.RedisCPU <= 0 {
		t.Fatalf("Redis CPU not read: %+v", res)
	}
}

func TestBrokerBenchFlags(t *testing.T) {
	for _, args := range [][]string{{"--nodes", "0"}, {"--nodes", "65"}, {"--rate", "0"}, {"--size", "10"}} {
		if code := brokerBench(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("roost bench broker %v: exit %d, want 2", args, code)
		}
	}
}
