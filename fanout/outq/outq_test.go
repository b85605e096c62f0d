package outq

import "testing"

// leastAllocs is testing.AllocsPerRun(runs, f), the lowest of a few rounds:
// AllocsPerRun counts every goroutine of the process, which may allocate
// now and then, while a path that allocates does so in every round.
func leastAllocs(runs int, f func()) float64 {
	n := testing.AllocsPerRun(runs, f)
	for i := 1; i < 5 && n > 0; i++ {
		n = min(n, testing.AllocsPerRun(runs, f))
	}
	return n
}

type owner struct{ id int }

func outs(n int) []*Out[*owner] {
	os := make([]*Out[*owner], n)
	for i := range os {
		os[i] = &Out[*owner]{Owner: &owner{id: i}}
	}
	return os
}

// fan queues frame for every Out, as a room's delivery does.
func fan(q *Queue[*owner], os []*Out[*owner], frame []byte) {
	for _, o := range os {
		q.Enqueue(o, frame)
	}
}

// flushAll writes every dirty Out whole, as a flush with room in every
// socket does.
func flushAll(q *Queue[*owner]) {
	for _, o := range q.TakeDirty() {
		q.Flushed(o)
	}
}

// pooled is the list capacity, in frame references, the freelists hold.
func (q *Queue[O]) pooled() int {
	n := 0
	for i := range q.free {
		for _, b := range q.free[i] {
			n += cap(b)
		}
	}
	return n
}

func TestOutboundLimitMarksSlowOnce(t *testing.T) {
	q := New[*owner](1000, 1<<20)
	fast, slow := &Out[*owner]{}, &Out[*owner]{}
	frame := make([]byte, 100)
	for i := 0; i < 9; i++ {
		fan(q, []*Out[*owner]{fast, slow}, frame)
		q.Flushed(fast) // fast drains, slow does not
	}
	if q.HasSlow() {
		t.Fatal("slow before the limit")
	}
	slow.SetBacklog(200) // the transport still holds some: counts too
	fan(q, []*Out[*owner]{fast, slow}, frame)
	fan(q, []*Out[*owner]{fast, slow}, frame)
	if s := q.TakeSlow(); len(s) != 1 || s[0] != slow || !slow.Slow() {
		t.Fatalf("want the slow Out handed over once, got %d", len(s))
	}
	if q.HasSlow() || slow.PendingBytes() != 900 {
		t.Fatalf("after TakeSlow: slow listed %v, pending %d (the caller drops it)", q.HasSlow(), slow.PendingBytes())
	}
	q.Drop(slow)
	fan(q, []*Out[*owner]{slow}, frame)
	if q.HasSlow() || slow.PendingBytes() != 0 {
		t.Fatalf("a slow Out gets nothing more: slow=%v pending=%d", q.HasSlow(), slow.PendingBytes())
	}
	if fast.PendingBytes() != 200 {
		t.Fatalf("fast Out: %d", fast.PendingBytes())
	}
}

// A closed Out takes nothing, limited or not.
func TestClosedTakesNothing(t *testing.T) {
	q := New[*owner](1<<20, 1<<20)
	o := &Out[*owner]{}
	o.Close()
	q.Enqueue(o, []byte("a"))
	q.Push(o, []byte("b"))
	if o.PendingBytes() != 0 || q.HasDirty() {
		t.Fatalf("closed Out: pending %d, dirty %v", o.PendingBytes(), q.HasDirty())
	}
}

func TestPendingGrowsThroughClasses(t *testing.T) {
	q := New[*owner](1<<30, 1<<30)
	o := &Out[*owner]{}
	for i := 0; i < 5000; i++ {
		q.Enqueue(o, []byte{byte(i)})
	}
	p := o.Pending()
	if len(p) != 5000 {
		t.Fatalf("pending %d", len(p))
	}
	for i, f := range p {
		if f[0] != byte(i) {
			t.Fatalf("order broken at %d", i)
		}
	}
	q.Flushed(o)
	if o.Pending() != nil || o.PendingBytes() != 0 {
		t.Fatal("flushed Out still holds a list")
	}
}

// A short write keeps the rest in order, counted, and the Out written in
// the period.
func TestSentKeepsTheRest(t *testing.T) {
	q := New[*owner](1<<30, 1<<30)
	o := &Out[*owner]{}
	for _, f := range []string{"aa", "bbb", "c"} {
		q.Enqueue(o, []byte(f))
	}
	q.TakeDirty()
	q.Sent(o, 1)
	if p := o.Pending(); len(p) != 2 || string(p[0]) != "bbb" || o.PendingBytes() != 4 || !q.WroteInPeriod(o) {
		t.Fatalf("after Sent(1): %q, %d bytes, wrote in period %v", p, o.PendingBytes(), q.WroteInPeriod(o))
	}
	q.NewPeriod()
	if q.WroteInPeriod(o) {
		t.Fatal("a new period: written in it before it began")
	}
}

// Only an Out not written in the current period is fresh.
func TestFreshOnlyUnwritten(t *testing.T) {
	q := New[*owner](1<<30, 1<<30)
	a, b := &Out[*owner]{}, &Out[*owner]{}
	q.Enqueue(a, []byte("x"))
	for _, o := range q.TakeDirty() {
		q.Sent(o, 1)
	}
	q.Enqueue(a, []byte("y"))
	q.Enqueue(b, []byte("z"))
	if f := q.TakeFresh(); len(f) != 1 || f[0] != b {
		t.Fatalf("fresh %d, want b alone", len(f))
	}
}

func TestUrgentPastFlushAt(t *testing.T) {
	q := New[*owner](1<<20, 300)
	o := &Out[*owner]{}
	q.Enqueue(o, make([]byte, 200))
	if len(q.TakeUrgent()) != 0 {
		t.Fatal("urgent too early")
	}
	q.Enqueue(o, make([]byte, 200))
	if u := q.TakeUrgent(); len(u) != 1 || u[0] != o {
		t.Fatal("want the Out urgent past flushAt")
	}
}

// An Out that got its frame and was written holds no list: the retained
// memory of a connection after a delivery is its struct. One frame per
// write (a connection of a chat, a frame every few hundred ms) takes a
// single-frame list while it waits, from the freelist, however many Outs
// are dirty at once, and gives it back.
func TestDeliveredOutHoldsNoBuffer(t *testing.T) {
	q := New[*owner](1<<30, 1<<30)
	os := outs(5000) // more dirty at once than any freelist keeps
	frame := make([]byte, 100)
	round := func() {
		fan(q, os, frame)
		flushAll(q)
	}
	round()
	if n := leastAllocs(20, round); n != 0 {
		t.Fatalf("one frame each to 5,000 Outs allocates %.1f per round", n)
	}
	if p := q.pooled(); p != len(os) {
		t.Fatalf("freelists hold %d frame references after single frames to %d Outs, want one each", p, len(os))
	}
	for i, o := range os {
		if cap(o.Pending()) != 0 || o.PendingBytes() != 0 {
			t.Fatalf("Out %d holds a list of %d after its write", i, cap(o.Pending()))
		}
	}
	// While it waits, an Out with one frame holds one reference.
	fan(q, os, frame)
	if c := cap(os[0].Pending()); c != 1 {
		t.Fatalf("an Out with one frame pending holds a list of %d", c)
	}
	flushAll(q)
	// What the freelists keep references no frame (its chunk can be freed).
	for _, b := range q.free[0] {
		if b[:1][0] != nil {
			t.Fatal("a pooled list still references a written frame")
		}
	}
}

// A busy room fills every member's list each tick: 330 members at
// 15,000-60,000 msg/s and a 4 ms tick get 60-250 frames per write, and a
// node whose ticks stretch under load 400 or more. Each list goes back to
// its freelist at the write and is taken again at the next tick, so the
// freelists must keep one per member: a list dropped at the write is a
// fresh allocation (12 KB at 512 frames) at the next tick for every member
// past the bound.
func TestBusyRoomListsFromFreelist(t *testing.T) {
	for _, k := range []int{60, 120, 250, 400} {
		q := New[*owner](1<<30, 1<<30)
		os := outs(330)
		frame := make([]byte, 100)
		tick := func() {
			for i := 0; i < k; i++ {
				fan(q, os, frame)
			}
			for _, o := range q.TakeDirty() {
				q.Sent(o, len(o.Pending()))
			}
		}
		tick()
		if n := leastAllocs(20, tick); n != 0 {
			t.Fatalf("%d frames each to 330 Outs allocates %.1f per tick", k, n)
		}
	}
}

// afterBacklog is a queue whose 2,000 Outs were sent 400 frames each and
// written: the lists of that backlog are back in the freelists.
func afterBacklog() (q *Queue[*owner], os []*Out[*owner], frame []byte) {
	q = New[*owner](1<<30, 1<<30)
	os = outs(2000)
	frame = make([]byte, 10)
	for i := 0; i < 400; i++ {
		fan(q, os, frame)
	}
	flushAll(q)
	return q, os, frame
}

// After a backlog has left, the freelists keep a bounded amount of list
// capacity, whatever the size of the backlog: 2,000 Outs with 400 frames
// each took 2,000 lists of 512 references (24 MB).
func TestFreelistsBoundedAfterBacklog(t *testing.T) {
	q, _, _ := afterBacklog()
	if got, bound := q.pooled()*24, len(classes)*maxFreeBytes; got > bound {
		t.Fatalf("freelists keep %d bytes of lists after the backlog, bound %d", got, bound)
	}
	// What they keep still serves the next burst without allocating.
	if q.pooled() == 0 {
		t.Fatal("freelists kept nothing")
	}
}

// A backlog's lists leave the freelists once no take reaches them, and
// the slices that held them shrink too; lists that delivery takes between
// two trims stay.
func TestFreelistsTrimmedAfterBacklog(t *testing.T) {
	q, os, frame := afterBacklog()
	if q.pooled() == 0 {
		t.Fatal("the backlog left nothing to trim")
	}
	for range 30 {
		q.TrimFree()
	}
	if n := q.pooled(); n != 0 {
		t.Fatalf("freelists keep %d frames of lists after 30 trims without a take", n)
	}
	for i := range q.free {
		if c := cap(q.free[i]); c > 64 {
			t.Fatalf("class %d: the freelist's slice still has room for %d lists", classes[i], c)
		}
	}

	// Steady delivery: every Out takes a list between two trims.
	for range 20 {
		fan(q, os, frame)
		flushAll(q)
		q.TrimFree()
	}
	if got := len(q.free[0]); got < len(os) {
		t.Fatalf("steady delivery to %d Outs: the one-frame freelist keeps %d lists", len(os), got)
	}
}

// BenchmarkEnqueue300: one frame to 300 Outs, a flush every 32 frames.
func BenchmarkEnqueue300(b *testing.B) {
	q := New[*owner](1<<30, 1<<30)
	os := outs(300)
	frame := make([]byte, 180)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)) * 300)
	for i := 0; b.Loop(); i++ {
		fan(q, os, frame)
		if i%32 == 31 {
			flushAll(q)
		}
	}
}

// Out's counters are 32-bit: a limit or a transport backlog past what they
// hold is held at MaxLimit, never wrapped to a negative count that would
// let a slow consumer queue without bound.
func TestLimitFitsTheCounters(t *testing.T) {
	q := New[int](1<<40, 64<<10)
	if q.Limit() != MaxLimit {
		t.Fatalf("limit %d, want %d", q.Limit(), MaxLimit)
	}
	var o Out[int]
	o.SetBacklog(1 << 40)
	if o.Backlog() != MaxLimit {
		t.Fatalf("backlog %d, want %d", o.Backlog(), MaxLimit)
	}
	if q.Fits(&o, 1) {
		t.Fatal("a backlog at the limit fits one byte more")
	}
}
