package fanout

import (
	"strings"
	"testing"

	"github.com/roost-chat/roost/proto"
)

func sseMembers(n int, keys ...string) []*Member {
	ms := members(n)
	for _, m := range ms {
		m.SetSSE(0)
		for _, k := range keys {
			m.SSEResume(k, 0, false)
		}
	}
	return ms
}

func msgFrame(room string, seq uint64) []byte {
	return proto.AppendMsgFrame(nil, room, seq, []byte("m"), "alice", 1764484800123, []byte("{\"t\":\n1}"))
}

// SSE members share one event per message; each gets its own id line
// with its position in every room it has been sent something in.
func TestSSEFanSharesEventPerMessage(t *testing.T) {
	tb := newTable(1<<20, 1<<20)
	a, b := tb.add([]byte("app/a")), tb.add([]byte("app/b:x"))
	ws := members(2)
	ss := sseMembers(2, "app/a", "app/b:x")
	for _, m := range append(ws, ss...) {
		tb.join(a, m)
		tb.join(b, m)
	}
	fa, fb := msgFrame("a", 41), msgFrame("b:x", 7)
	tb.fan(a, 41, fa, nil)
	tb.fan(b, 7, fb, nil)
	for _, m := range ws {
		if p := m.Out.Pending(); len(p) != 2 || &p[0][0] != &fa[0] || &p[1][0] != &fb[0] {
			t.Fatalf("websocket member: %q", p)
		}
	}
	p0, p1 := ss[0].Out.Pending(), ss[1].Out.Pending()
	if len(p0) != 4 || &p0[0][0] != &p1[0][0] || &p0[2][0] != &p1[2][0] {
		t.Fatalf("SSE members do not share the events: %q / %q", p0, p1)
	}
	payload, _ := proto.ServerFramePayload(fa)
	wantEv := "event: msg\ndata: " + strings.Replace(string(payload), "\n", "\ndata: ", 1) + "\n"
	if string(p0[0]) != wantEv || string(p0[1]) != "id: a:41\n\n" || string(p0[3]) != "id: a:41,b:x:7\n\n" {
		t.Fatalf("events %q", p0)
	}
	// The position walks back through the parser to the same rooms.
	var got []string
	err := proto.ParseSSEPosition([]byte("a:41,b:x:7"), func(room []byte, seq uint64) bool {
		got = append(got, string(room)+"="+string(rune('0'+seq%10)))
		return true
	})
	if err != nil || strings.Join(got, " ") != "a=1 b:x=7" {
		t.Fatalf("parse: %v %v", got, err)
	}
}

// A member of one room takes the message's whole event, id line included,
// as one slice shared with every such member: its position is the room's
// seq alone.
func TestSSEOneRoomMembersShareTheWholeEvent(t *testing.T) {
	tb := newTable(1<<20, 1<<20)
	r := tb.add([]byte("app/lobby"))
	ss := sseMembers(3, "app/lobby")
	for _, m := range ss {
		tb.join(r, m)
	}
	f := msgFrame("lobby", 9)
	tb.fan(r, 9, f, nil)
	payload, _ := proto.ServerFramePayload(f)
	want := "event: msg\ndata: " + strings.Replace(string(payload), "\n", "\ndata: ", 1) + "\nid: lobby:9\n\n"
	for _, m := range ss {
		p := m.Out.Pending()
		if len(p) != 1 || string(p[0]) != want || &p[0][0] != &ss[0].Out.Pending()[0][0] {
			t.Fatalf("pending %q, want the one shared event %q", p, want)
		}
	}
}

// SSE delivery allocates nothing once warm: a message to 150 WebSocket
// and 150 SSE members (each in three rooms, so its id names three), then
// the flush bookkeeping. The events come out of the table's arena, one
// 64 KiB chunk per few hundred messages, like the frames they are built
// from; AllocsPerRun reports that as 0.
func TestSSEDeliverAllocationFree(t *testing.T) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/room"))
	keys := []string{"app/room", "app/other", "app/third"}
	ss := sseMembers(150, keys...)
	for _, m := range ss {
		m.sse.pos[1].has, m.sse.pos[2].has = true, true
	}
	for _, m := range append(members(150), ss...) {
		tb.join(r, m)
	}
	frame := msgFrame("room", 1)
	seq := uint64(0)
	round := func() {
		for i := 0; i < 5; i++ {
			seq++
			tb.fan(r, seq, frame, nil)
		}
		tb.flushAll()
	}
	round()
	if n := leastAllocs(100, round); n != 0 {
		t.Fatalf("SSE delivery allocates %.1f per round", n)
	}
}

// BenchmarkDeliverSSE300: one message to 300 SSE members of a room (the
// event built once, an id line each), against BenchmarkDeliver300.
func BenchmarkDeliverSSE300(b *testing.B) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/room"))
	for _, m := range sseMembers(300, "app/room") {
		tb.join(r, m)
	}
	frame := msgFrame("room", 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tb.fan(r, uint64(i+1), frame, nil)
		if i%32 == 31 {
			tb.flushAll()
		}
	}
}

type sseRecLoops struct{ events map[int][]byte }

func (r *sseRecLoops) deliver(l int, _ string, _ uint64, _, sse []byte) { r.events[l] = sse }
func (r *sseRecLoops) subscribed(int, string, error)                    {}
func (r *sseRecLoops) reset(int)                                        {}

// The hub builds a message's SSE event once for the node, only while the
// room has SSE members, and every loop holding the room gets the same
// bytes.
func TestHubBuildsSSEEventOncePerNode(t *testing.T) {
	loops := &sseRecLoops{events: map[int][]byte{}}
	sub := &recSub{}
	h := newHub(loops, 3)
	h.sub = sub
	h.join("a/r", 0)
	h.join("a/r", 2)
	sub.pending[0](nil)
	f := msgFrame("r", 5)
	h.OnMessage("a/r", 5, f)
	if loops.events[0] != nil || loops.events[2] != nil {
		t.Fatal("an SSE event built for a room without SSE members")
	}
	h.sseMembers("a/r", 1)
	h.OnMessage("a/r", 5, f)
	e0, e2 := loops.events[0], loops.events[2]
	if e0 == nil || &e0[0] != &e2[0] || !strings.HasSuffix(string(e0), "\nid: r:5\n\n") || !strings.HasPrefix(string(e0), "event: msg\ndata: {") {
		t.Fatalf("events %q %q", e0, e2)
	}
	tb := newTable(1<<20, 1<<20)
	r := tb.add([]byte("a/r"))
	one := sseMembers(1, "a/r")[0]
	two := sseMembers(1, "a/r", "a/other")[0]
	tb.join(r, one)
	tb.join(r, two)
	tb.fan(r, 5, f, e0)
	if p := one.Out.Pending(); len(p) != 1 || &p[0][0] != &e0[0] || len(p[0]) != len(e0) {
		t.Fatalf("one-room member: %q", p)
	}
	if p := two.Out.Pending(); len(p) != 2 || &p[0][0] != &e0[0] || string(p[0])+"id: r:5\n\n" != string(e0) || string(p[1]) != "id: r:5\n\n" {
		t.Fatalf("two-room member: %q", p)
	}
	h.sseMembers("a/r", -1)
	h.OnMessage("a/r", 6, msgFrame("r", 6))
	if loops.events[0] != nil {
		t.Fatal("an SSE event built after the last SSE member left")
	}
}
