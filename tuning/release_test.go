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
		return r.step(now, time.Second, heapSample{allocs: allocs, live: live})
	}
	r.step(now, time.Second, heapSample{allocs: allocs, live: live})
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

// Under steady load, free pages that stay free across collections for
// releaseSpareFor are returned, at most once per releaseSpareGap; free
// pages the cycle uses again (some sample finds them gone), or a stretch
// without two collections, are not.
func TestReleaseSpareUnderLoad(t *testing.T) {
	var r releaser
	now := time.Unix(1_000_000, 0)
	h := heapSample{live: 19 << 20}
	sample := func(free uint64, gc bool) bool {
		now = now.Add(time.Second)
		h.allocs += 3 << 20 // busy every second: no burst release
		h.free = free
		if gc {
			h.cycles++
		}
		return r.step(now, time.Second, h)
	}
	r.step(now, time.Second, h)
	// The cycle uses its free pages: down to 0.5 MiB before each
	// collection, 5 MiB after it. Never released.
	for i := range 120 {
		if sample([]uint64{5 << 20, 0.5 * (1 << 20)}[i%2], i%2 == 0) {
			t.Fatalf("released the cycle's own pages at %d s", i)
		}
	}
	// 2 MiB stays free through every sample (the floor is live/16, 1.19
	// MiB): released once the stretch is long enough.
	released := -1
	for i := range 40 {
		if sample([]uint64{6 << 20, 2 << 20}[i%2], i%2 == 0) {
			released = i
			break
		}
	}
	if released < 9 || released > 12 {
		t.Fatalf("spare pages released after %d s, want ~10 s", released+1)
	}
	// Spare again at once: not before releaseSpareGap.
	for i := range 25 {
		if sample(3<<20, i%2 == 0) {
			t.Fatalf("released again %d s after the last", i+1)
		}
	}
	ok := false
	for i := range 10 {
		if sample(3<<20, i%2 == 0) {
			ok = true
			break
		}
	}
	if !ok {
		t.Fatal("spare pages not released again past the gap")
	}
	// Spare but no collection in the stretch (a steady idle node): the
	// free pages are not known to be the cycle's leftovers. None.
	for i := range 60 {
		if sample(3<<20, false) {
			t.Fatalf("released without collections at %d s", i)
		}
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
