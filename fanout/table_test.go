package fanout

import (
	"fmt"
	"testing"
)

// testOwner counts what the table asks of a member's connection.
type testOwner struct{ writes, resyncs int }

func (o *testOwner) Write()        { o.writes++ }
func (o *testOwner) Resync()       { o.resyncs++ }
func (o *testOwner) Buffered() int { return 0 }
func (o *testOwner) User() string  { return "u" }

func members(n int) []*Member {
	ms := make([]*Member, n)
	for i := range ms {
		ms[i] = &Member{Owner: &testOwner{}}
	}
	return ms
}

func TestJoinLeaveKeepsPositions(t *testing.T) {
	tb := newTable(1<<20, 64<<10)
	a, b := tb.add([]byte("app/a")), tb.add([]byte("app/b"))
	ms := members(50)
	for _, m := range ms {
		tb.join(a, m)
		tb.join(b, m)
	}
	// Leave in an order that moves members around, then check every
	// remaining member still gets exactly one copy of each frame.
	for i := 0; i < 50; i += 3 {
		tb.leave(a, ms[i])
	}
	for i := 1; i < 50; i += 4 {
		tb.leave(b, ms[i])
	}
	tb.fan(a, 0, []byte("A"), nil)
	tb.fan(b, 0, []byte("B"), nil)
	for i, m := range ms {
		want := ""
		if i%3 != 0 {
			want += "A"
		}
		if i%4 != 1 {
			want += "B"
		}
		got := ""
		for _, f := range m.Pending() {
			got += string(f)
		}
		if got != want {
			t.Fatalf("member %d: got %q want %q", i, got, want)
		}
		if m.in(a) != (i%3 != 0) || m.in(b) != (i%4 != 1) {
			t.Fatalf("member %d: In disagrees", i)
		}
	}
	for _, m := range ms {
		tb.leaveAll(m)
	}
	if a.Members() != 0 || b.Members() != 0 {
		t.Fatalf("rooms not empty: %d %d", a.Members(), b.Members())
	}
}

func TestOutboundLimitMarksSlowOnce(t *testing.T) {
	tb := newTable(1000, 1<<20)
	r := tb.add([]byte("app/r"))
	fast, slow := &Member{Owner: &testOwner{}}, &Member{Owner: &testOwner{}}
	tb.join(r, fast)
	tb.join(r, slow)
	frame := make([]byte, 100)
	for i := 0; i < 9; i++ {
		tb.fan(r, 0, frame, nil)
		tb.Flushed(fast) // fast drains, slow does not
	}
	if tb.HasSlow() {
		t.Fatal("slow before the limit")
	}
	slow.Backlog = 200 // the transport still holds some: counts too
	tb.fan(r, 0, frame, nil)
	if len(tb.slow) != 1 || tb.slow[0] != slow || !slow.Slow() {
		t.Fatalf("want slow member reported once, got %d", len(tb.slow))
	}
	tb.CloseSlow()
	if o := slow.Owner.(*testOwner); o.resyncs != 1 || slow.PendingBytes() != 0 {
		t.Fatalf("slow member: resyncs %d, pending %d after CloseSlow", o.resyncs, slow.PendingBytes())
	}
	tb.fan(r, 0, frame, nil)
	if tb.HasSlow() || slow.PendingBytes() != 0 {
		t.Fatalf("a slow member gets nothing more: slow=%v pending=%d", tb.HasSlow(), slow.PendingBytes())
	}
	if fast.PendingBytes() != 200 {
		t.Fatalf("fast member: %d", fast.PendingBytes())
	}
}

func TestPendingGrowsThroughClasses(t *testing.T) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/r"))
	m := &Member{}
	tb.join(r, m)
	for i := 0; i < 5000; i++ {
		tb.fan(r, 0, []byte{byte(i)}, nil)
	}
	p := m.Pending()
	if len(p) != 5000 {
		t.Fatalf("pending %d", len(p))
	}
	for i, f := range p {
		if f[0] != byte(i) {
			t.Fatalf("order broken at %d", i)
		}
	}
	tb.Flushed(m)
	if m.Pending() != nil || m.PendingBytes() != 0 {
		t.Fatal("flushed member still holds a list")
	}
}

func TestUrgentPastFlushAt(t *testing.T) {
	tb := newTable(1<<20, 300)
	r := tb.add([]byte("app/r"))
	m := &Member{}
	tb.join(r, m)
	tb.fan(r, 0, make([]byte, 200), nil)
	if len(tb.TakeUrgent()) != 0 {
		t.Fatal("urgent too early")
	}
	tb.fan(r, 0, make([]byte, 200), nil)
	if u := tb.TakeUrgent(); len(u) != 1 || u[0] != m {
		t.Fatal("want member urgent past flushAt")
	}
}

func TestArenaFramesDoNotOverlap(t *testing.T) {
	a := NewArena(64)
	var frames [][]byte
	for i := 0; i < 100; i++ {
		f := a.Keep(append(a.Space(10), fmt.Sprintf("f%03d", i)...))
		frames = append(frames, f)
		if cap(f) != len(f) {
			t.Fatal("frame capacity not capped")
		}
	}
	for i, f := range frames {
		if string(f) != fmt.Sprintf("f%03d", i) {
			t.Fatalf("frame %d clobbered: %q", i, f)
		}
	}
}

// The delivery path allocates nothing once warm: one frame to 300 members,
// then the flush bookkeeping, at steady state.
func TestDeliverAllocationFree(t *testing.T) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/room"))
	ms := members(300)
	for _, m := range ms {
		tb.join(r, m)
	}
	frame := make([]byte, 180)
	round := func() {
		for i := 0; i < 5; i++ {
			tb.fan(r, 0, frame, nil)
		}
		for _, m := range tb.TakeDirty() {
			tb.Flushed(m)
		}
	}
	round()
	if n := leastAllocs(100, round); n != 0 {
		t.Fatalf("delivery allocates %.1f per round", n)
	}
}

// pooled is the list capacity, in frame references, the table's freelists
// hold.
func (t *Table) pooled() int {
	n := 0
	for i := range t.free {
		for _, b := range t.free[i] {
			n += cap(b)
		}
	}
	return n
}

// A connection that got its frame and was written holds no list: the
// retained memory of a member after a delivery is its struct. One frame
// per write (a connection of a chat, a frame every few hundred ms) takes a
// single-frame list while it waits, from the freelist, however many
// members are dirty at once, and gives it back.
func TestDeliveredMemberHoldsNoBuffer(t *testing.T) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/room"))
	ms := members(5000) // more members dirty at once than any freelist keeps
	for _, m := range ms {
		tb.join(r, m)
	}
	frame := make([]byte, 100)
	round := func() {
		tb.fan(r, 0, frame, nil)
		for _, m := range tb.TakeDirty() {
			tb.Flushed(m)
		}
	}
	round()
	if n := leastAllocs(20, round); n != 0 {
		t.Fatalf("one frame each to 5,000 members allocates %.1f per round", n)
	}
	if p := tb.pooled(); p != len(ms) {
		t.Fatalf("freelists hold %d frame references after single frames to %d members, want one each", p, len(ms))
	}
	for i, m := range ms {
		if cap(m.Pending()) != 0 || m.PendingBytes() != 0 {
			t.Fatalf("member %d holds a list of %d after its write", i, cap(m.Pending()))
		}
	}
	// While it waits, a member with one frame holds one reference.
	tb.fan(r, 0, frame, nil)
	if c := cap(ms[0].Pending()); c != 1 {
		t.Fatalf("a member with one frame pending holds a list of %d", c)
	}
	for _, m := range tb.TakeDirty() {
		tb.Flushed(m)
	}
	// What the freelists keep references no frame (its chunk can be freed).
	for _, b := range tb.free[0] {
		if b[:1][0] != nil {
			t.Fatal("a pooled list still references a written frame")
		}
	}
}

// A busy room fills every member's list each tick: 330 members at
// 15,000-60,000 msg/s and a 4 ms tick get 60-250 frames per write, and a
// node whose ticks stretch under load 400 or more. Each
// list goes back to its freelist at the member's write and is taken again
// at the next tick, so the freelists must keep one per member: a list
// dropped at the write is a fresh allocation (12 KB at 512 frames) at the
// next tick for every member past the bound.
func TestBusyRoomListsFromFreelist(t *testing.T) {
	for _, k := range []int{60, 120, 250, 400} {
		tb := newTable(1<<30, 1<<30)
		r := tb.add([]byte("app/room"))
		for _, m := range members(330) {
			tb.join(r, m)
		}
		frame := make([]byte, 100)
		tick := func() {
			for i := 0; i < k; i++ {
				tb.fan(r, 0, frame, nil)
			}
			for _, m := range tb.TakeDirty() {
				tb.Sent(m, len(m.Pending()))
			}
		}
		tick()
		if n := leastAllocs(20, tick); n != 0 {
			t.Fatalf("%d frames each to 330 members allocates %.1f per tick", k, n)
		}
	}
}

// afterBacklog is a table whose room of 2,000 members was sent 400
// frames each and written: the lists of that backlog are back in the
// freelists.
func afterBacklog() (tb *Table, r *Room, ms []*Member, frame []byte) {
	tb = newTable(1<<30, 1<<30)
	r = tb.add([]byte("app/room"))
	ms = members(2000)
	for _, m := range ms {
		tb.join(r, m)
	}
	frame = make([]byte, 10)
	for i := 0; i < 400; i++ {
		tb.fan(r, 0, frame, nil)
	}
	for _, m := range tb.TakeDirty() {
		tb.Flushed(m)
	}
	return tb, r, ms, frame
}

// After a backlog has left, the freelists keep a bounded amount of list
// capacity, whatever the size of the backlog: 2,000 members with 400
// frames each took 2,000 lists of 512 references (24 MB).
func TestFreelistsBoundedAfterBacklog(t *testing.T) {
	tb, _, _, _ := afterBacklog()
	if got, bound := tb.pooled()*24, len(classes)*maxFreeBytes; got > bound {
		t.Fatalf("freelists keep %d bytes of lists after the backlog, bound %d", got, bound)
	}
	// What they keep still serves the next burst without allocating.
	if tb.pooled() == 0 {
		t.Fatal("freelists kept nothing")
	}
}

// A backlog's lists leave the freelists once no take reaches them, and
// the slices that held them shrink too; lists that delivery takes between
// two trims stay.
func TestFreelistsTrimmedAfterBacklog(t *testing.T) {
	tb, r, ms, frame := afterBacklog()
	if tb.pooled() == 0 {
		t.Fatal("the backlog left nothing to trim")
	}
	for range 30 {
		tb.TrimFree()
	}
	if n := tb.pooled(); n != 0 {
		t.Fatalf("freelists keep %d frames of lists after 30 trims without a take", n)
	}
	for i := range tb.free {
		if c := cap(tb.free[i]); c > 64 {
			t.Fatalf("class %d: the freelist's slice still has room for %d lists", classes[i], c)
		}
	}

	// Steady delivery: every member takes a list between two trims.
	for round := range 20 {
		tb.fan(r, uint64(round), frame, nil)
		for _, m := range tb.TakeDirty() {
			tb.Flushed(m)
		}
		tb.TrimFree()
	}
	if got := len(tb.free[0]); got < len(ms) {
		t.Fatalf("steady delivery to %d members: the one-frame freelist keeps %d lists", len(ms), got)
	}
}

// BenchmarkDeliver300: one pre-encoded frame to 300 members of a room
// (the fan-out step; the write is in loop's BenchmarkFanout300).
func BenchmarkDeliver300(b *testing.B) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/room"))
	for _, m := range members(300) {
		tb.join(r, m)
	}
	frame := make([]byte, 180)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)) * 300)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tb.fan(r, 0, frame, nil)
		if i%32 == 31 { // a flush tick every 32 messages
			for _, m := range tb.TakeDirty() {
				tb.Flushed(m)
			}
		}
	}
}

func BenchmarkHubOnMessage(b *testing.B) {
	h := newHub(nopLoops{}, 4)
	h.sub = nopSub{}
	for l := 0; l < 4; l++ {
		h.join("app/room", l)
	}
	frame := make([]byte, 180)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.OnMessage("app/room", 1, frame)
		}
	})
}

type nopLoops struct{}

func (nopLoops) deliver(int, string, uint64, []byte, []byte) {}
func (nopLoops) subscribed(int, string, error)               {}
func (nopLoops) reset(int)                                   {}

type nopSub struct{}

func (nopSub) Subscribe(_ string, ready func(error)) { ready(nil) }
func (nopSub) Unsubscribe(string)                    {}
