package tuning

import (
	"context"
	"testing"
	"time"
)

// A release comes once the process is quiet after a burst of allocation,
// once per burst; never under steady allocation, nor for a burst small
// for the heap.
func TestReleaseAfterBurst(t *testing.T) {
	var r releaser
	now := time.Unix(1_000_000, 0)
	var allocs uint64
	const live = 12 << 20
	sample := func(d uint64) bool {
		now = now.Add(time.Second)
		allocs += d
		return r.step(now, time.Second, allocs, live)
	}
	r.step(now, time.Second, allocs, live)
	// Steady load: 8 MiB a second for a minute, never quiet.
	for i := range 60 {
		if sample(8 << 20) {
			t.Fatalf("released under load at %d s", i)
		}
	}
	// Quiet after it: one release, then none while idle.
	if !sample(100 << 10) {
		t.Fatal("no release once quiet after the load")
	}
	for i := range 30 {
		if sample(100 << 10) {
			t.Fatalf("released again while idle, %d s later", i)
		}
	}
	// A burst small for the heap (under a quarter of it): none.
	sample(2 << 20)
	for range 20 {
		if sample(10 << 10) {
			t.Fatal("released after a small burst")
		}
	}
	// Idle for long: the trickle is no burst.
	for range 600 {
		if sample(500 << 10) {
			t.Fatal("released while idle")
		}
	}
	// A connect storm of 2 s: released at the first quiet second.
	sample(30 << 20)
	sample(30 << 20)
	if !sample(200 << 10) {
		t.Fatal("no release after the storm")
	}
}

// The loop ends with its context and does release (smoke: it runs).
func TestReleaseAfterBurstsRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { ReleaseAfterBursts(ctx, 5*time.Millisecond, nil); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("did not end with its context")
	}
}
