package fanout

import (
	"fmt"
	"testing"

	"github.com/roost-chat/roost/fanout/outq"
)

// testOwner counts what the table asks of a member's connection.
type testOwner struct{ writes, resyncs int }

func (o *testOwner) Write()        { o.writes++ }
func (o *testOwner) Resync()       { o.resyncs++ }
func (o *testOwner) Buffered() int { return 0 }
func (o *testOwner) User() string  { return "u" }

// member is a Member with its outbound queue, as the loop's connection
// holds both.
func member(o Owner) *Member {
	return &Member{Out: outq.Out[Owner]{Owner: o}}
}

func members(n int) []*Member {
	ms := make([]*Member, n)
	for i := range ms {
		ms[i] = member(&testOwner{})
	}
	return ms
}

// flushAll writes every dirty member whole, as a flush with room in every
// socket does.
func (t *Table) flushAll() {
	for _, o := range t.q.TakeDirty() {
		t.q.Flushed(o)
	}
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
		for _, f := range m.Out.Pending() {
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
	fast, slow := member(&testOwner{}), member(&testOwner{})
	tb.join(r, fast)
	tb.join(r, slow)
	frame := make([]byte, 100)
	for i := 0; i < 9; i++ {
		tb.fan(r, 0, frame, nil)
		tb.q.Flushed(&fast.Out) // fast drains, slow does not
	}
	if tb.q.HasSlow() {
		t.Fatal("slow before the limit")
	}
	slow.Out.SetBacklog(200) // the transport still holds some: counts too
	tb.fan(r, 0, frame, nil)
	if !tb.q.HasSlow() || !slow.Out.Slow() || fast.Out.Slow() {
		t.Fatalf("want the slow member marked: listed %v, slow %v, fast %v", tb.q.HasSlow(), slow.Out.Slow(), fast.Out.Slow())
	}
	tb.CloseSlow()
	if o := slow.Out.Owner.(*testOwner); o.resyncs != 1 || slow.Out.PendingBytes() != 0 {
		t.Fatalf("slow member: resyncs %d, pending %d after CloseSlow", o.resyncs, slow.Out.PendingBytes())
	}
	tb.fan(r, 0, frame, nil)
	if tb.q.HasSlow() || slow.Out.PendingBytes() != 0 {
		t.Fatalf("a slow member gets nothing more: slow=%v pending=%d", tb.q.HasSlow(), slow.Out.PendingBytes())
	}
	if fast.Out.PendingBytes() != 200 {
		t.Fatalf("fast member: %d", fast.Out.PendingBytes())
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
		tb.flushAll()
	}
	round()
	if n := leastAllocs(100, round); n != 0 {
		t.Fatalf("delivery allocates %.1f per round", n)
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
			tb.flushAll()
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
