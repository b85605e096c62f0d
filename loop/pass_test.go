package loop

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// peerBytes reads what one receiver's peer has been sent so far.
func (r *fanoutRig) peerBytes(tb testing.TB, i int) int {
	tb.Helper()
	buf := make([]byte, 64<<10)
	total := 0
	for {
		n, err := syscall.Read(int(r.peers[i].Fd()), buf)
		if n > 0 {
			total += n
		}
		if err != nil || n <= 0 {
			return total
		}
	}
}

// TestPassTakesMessagesOnTheWay: a flush longer than its slice is written
// slice by slice, each after the loop's input was read (OnTraffic's kick,
// or the pass goroutine's task when there was nothing to read); a message
// delivered mid-pass goes to the members not written yet in the same
// write as the first, and to those already written at the next tick. A
// tick during the pass does not write; a drain round's flush finishes it.
func TestPassTakesMessagesOnTheWay(t *testing.T) {
	const n = 100 // slices of passCheck (32) members: 32, 32, 32, 4
	rig := newFanoutRig(t, n, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself
	l.slice = time.Nanosecond             // every slice ends at its first clock check
	st := &l.srv.Stats
	writes := func() uint64 { return st.Writes.Load() }
	frames := func() uint64 { return st.FramesOut.Load() }
	read := func() { l.passFresh = false; l.kick() } // what OnTraffic does after a read
	for i := range rig.peers {
		rig.peerBytes(t, i) // the joined frames
	}

	rig.next()
	l.kick()
	if writes() != 32 || !l.passing || !l.ticking {
		t.Fatalf("first slice: %d writes, passing %v, ticking %v; want 32 and the pass under way", writes(), l.passing, l.ticking)
	}
	l.kick() // the same wake-up, nothing read: no slice
	if writes() != 32 {
		t.Fatalf("a second slice without a read in between: %d writes", writes())
	}
	// Nothing to read: the pass goroutine's task lets the next slice go.
	rig.pump(t, func() bool { return writes() == 64 })
	rig.next() // mid-pass: 36 members not written yet, 64 written
	l.tick()   // the tick during the pass leaves it alone
	if writes() != 64 {
		t.Fatalf("tick during the pass: %d writes, want none", writes())
	}
	read()
	if writes() != 96 || frames() != 64+2*32 {
		t.Fatalf("slice after the second message: %d writes, %d frames; want 32 writes of both frames", writes(), frames())
	}
	read()
	if writes() != 100 || frames() != 128+2*4 || l.passing || !l.ticking {
		t.Fatalf("last slice: %d writes, %d frames, passing %v, ticking %v; want the pass ended and a tick armed", writes(), frames(), l.passing, l.ticking)
	}
	l.slice = time.Hour
	l.tick()
	if writes() != 164 || frames() != 136+64 {
		t.Fatalf("tick after the pass: %d writes, %d frames; want the 64 members written before the second message", writes(), frames())
	}
	for i := range rig.peers {
		if got := rig.peerBytes(t, i); got != 2*len(rig.frame) {
			t.Fatalf("receiver %d got %d bytes, want both frames (%d)", i, got, 2*len(rig.frame))
		}
	}
	l.tick() // quiet: stops
	if l.ticking {
		t.Fatal("quiet tick after the pass did not stop the ticking")
	}

	// A drain round's flush finishes a pass at once.
	l.slice = time.Nanosecond
	rig.next()
	l.kick()
	if !l.passing {
		t.Fatal("no pass")
	}
	l.flush()
	if l.passing || writes() != 264 {
		t.Fatalf("flush during a pass: passing %v, %d writes; want every member written", l.passing, writes())
	}
	_ = l.drain(context.Background())
}

// TestPassAllocationFree: passes (slices, the reads between them, the
// pass goroutine's tasks, the tick after) allocate nothing in steady state.
func TestPassAllocationFree(t *testing.T) {
	rig := newFanoutRig(t, 300, true)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Hour // no tick timer fires (a goroutine each) while allocations are counted
	l.slice = time.Nanosecond
	cycle := func() {
		rig.next()
		l.kick()
		rig.next() // on the way: joins the rest of the pass
		for l.passing {
			_ = l.drain(context.Background()) // the pass goroutine's tasks, if they came
			l.passFresh = false
			l.kick()
		}
		l.slice = time.Hour
		l.tick() // the members written before the second message
		l.tick() // quiet: stops
		l.slice = time.Nanosecond
	}
	cycle()
	cycle()
	if n := leastAllocs(20, cycle); n != 0 {
		t.Fatalf("a pass allocates %.1f per cycle", n)
	}
}
