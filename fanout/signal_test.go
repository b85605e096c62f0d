package fanout

import (
	"testing"

	"github.com/roost-chat/roost/proto"
)

// A signal reaches every live member but its sender; a member over half
// its outbound limit skips it and is not made slow; a signal is queued
// past the limit check, so it never marks a member slow.
func TestSignalSkipsSenderAndBusyMembers(t *testing.T) {
	tb := newTable(1000, 1<<20)
	r := tb.add([]byte("app/r"))
	sender, other, busy := member(&testOwner{}), member(&testOwner{}), member(&testOwner{})
	for _, m := range []*Member{sender, other, busy} {
		tb.join(r, m)
	}
	sender.Chat().sig = signalBit | 7
	busy.Out.SetBacklog(501) // over half of 1000
	frame := proto.AppendSignalFrame(nil, "r", "alice", []byte(`{"typing":true}`))
	tb.signal(r, sender.chat.sig, frame, nil)
	if sender.Out.PendingBytes() != 0 {
		t.Fatal("the sender got its own signal")
	}
	if other.Out.PendingBytes() != len(frame) {
		t.Fatalf("other member: %d pending, want %d", other.Out.PendingBytes(), len(frame))
	}
	if busy.Out.PendingBytes() != 0 || busy.Out.Slow() || tb.q.HasSlow() {
		t.Fatalf("busy member: pending %d, slow %v", busy.Out.PendingBytes(), busy.Out.Slow())
	}
	// Up to half the limit, signals are taken; past it they are skipped,
	// and the member never turns slow.
	for i := 0; i < 100; i++ {
		tb.signal(r, sender.chat.sig, frame, nil)
	}
	if other.Out.Slow() || tb.q.HasSlow() || other.Out.PendingBytes() > 500+len(frame) {
		t.Fatalf("signals made a member slow or passed half its limit: pending %d", other.Out.PendingBytes())
	}
}

// An SSE member gets the signal as "event: signal" with no id line: a
// signal moves no position.
func TestSignalSSEEventHasNoID(t *testing.T) {
	frame := proto.AppendSignalFrame(nil, "r", "alice", []byte(`1`))
	ev := buildSignalEvent(NewArena(1024), frame)
	want := "event: signal\ndata: {\"op\":\"signal\",\"room\":\"r\",\"from\":\"alice\",\"body\":1}\n\n"
	if string(ev) != want {
		t.Fatalf("event %q, want %q", ev, want)
	}
}

// Signal delivery allocates nothing once warm, like a message's.
func TestSignalDeliveryAllocationFree(t *testing.T) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/room"))
	ms := members(300)
	for _, m := range ms {
		tb.join(r, m)
	}
	ms[0].Chat().sig = signalBit | 1
	frame := proto.AppendSignalFrame(nil, "room", "alice", []byte(`{"typing":true}`))
	round := func() {
		for i := 0; i < 5; i++ {
			tb.signal(r, ms[0].chat.sig, frame, nil)
		}
		tb.flushAll()
	}
	round()
	if n := leastAllocs(100, round); n != 0 {
		t.Fatalf("signal delivery allocates %.1f per round", n)
	}
}

// A member with echo off skips its own publishes, by id before its ack and
// by seq after, and gets everyone else's; the fan-out stays allocation-free.
func TestEchoOffSkipsOwn(t *testing.T) {
	tb := newTable(1<<30, 1<<30)
	r := tb.add([]byte("app/r"))
	me, other := member(&testOwner{}), member(&testOwner{})
	tb.join(r, me)
	tb.join(r, other)
	tb.SetEcho(me, "app/r", false)
	me.Published("app/r", []byte("k1"))
	me.Published("app/r", []byte("k2"))
	me.Acked("app/r", []byte("k2"), 2)
	frame := func(seq uint64, id, from string) []byte {
		return proto.AppendMsgFrame(nil, "r", seq, []byte(id), from, 1, []byte(`1`))
	}
	tb.fan(r, 1, frame(1, "k1", "u"), nil) // before its ack: by id
	tb.fan(r, 2, frame(2, "k2", "u"), nil) // after: by seq
	tb.fan(r, 3, frame(3, "k1", "v"), nil) // another user's k1
	if me.Out.PendingBytes() != len(frame(3, "k1", "v")) || len(me.chat.own.pubs) != 0 {
		t.Fatalf("own member: %d pending, %d remembered", me.Out.PendingBytes(), len(me.chat.own.pubs))
	}
	if len(other.Out.Pending()) != 3 {
		t.Fatalf("other member got %d", len(other.Out.Pending()))
	}
	f := frame(4, "k9", "v")
	round := func() {
		me.Published("app/r", []byte("k"))
		tb.fan(r, 4, f, nil)
		me.Acked("app/r", []byte("k"), 0)
		tb.flushAll()
	}
	round()
	if n := leastAllocs(100, round); n != 0 {
		t.Fatalf("echo-off fan-out allocates %.1f per round", n)
	}
}

// Sending a signal allocates nothing once warm: the frame is carved from
// the loop's arena and the job is a value on a bounded queue.
func TestSignalSendAllocationFree(t *testing.T) {
	tb := newTable(1<<20, 1<<20)
	tb.node = &Node{signals: make(chan signalJob, 8), sigNode: signalNode()}
	m := member(&testOwner{})
	body := []byte(`{"typing":true}`)
	room := []byte("room")
	round := func() {
		tb.Signal(m, "app/room", room, "alice", body)
		<-tb.node.signals
	}
	round()
	if n := leastAllocs(1000, round); n != 0 {
		t.Fatalf("sending a signal allocates %.2f per signal", n)
	}
}
