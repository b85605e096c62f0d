package fanout

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// askReceipts runs a receipts query of key on p (not running its
// goroutine nor its workers: the test is them) and returns the answer's
// frame.
func askReceipts(t testing.TB, p *positions, l *testLoop, key string) string {
	t.Helper()
	p.do(posJob{receipts: true, key: key})
	for _, q := range p.rcptQ {
		select {
		case r := <-q:
			p.readReceipts(&r)
			p.receiptsDone(r)
		default:
		}
	}
	p.flushAnswers()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.evs) != 1 || l.evs[0].err != nil {
		t.Fatalf("receipts answer: %+v", l.evs)
	}
	f, _ := proto.ServerFramePayload(l.evs[0].frame)
	l.evs = nil
	return string(f)
}

// receiptsNode is testNode for tests and benchmarks alike.
func receiptsNode(tb testing.TB, st persist.Store) (*Node, *testLoop) {
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 2}, Parts{Store: st, Pool: PoolConfig{Window: -1}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	l := &testLoop{}
	n.NewTable(0, l)
	return n, l
}

// A receipts query answers from the room's positions only: the moves other
// nodes announced in other rooms, of the same users or others, change
// neither the answer nor what it holds of the room's.
func TestReceiptsQueryReadsItsRoomOnly(t *testing.T) {
	st := persist.NewMemory(0)
	n, l := receiptsNode(t, st)
	commit(t, st, "test/r", 9)
	commit(t, st, "test/s", 9)
	if err := st.SaveReads(context.Background(), []persist.ReadMark{{Key: "test/r", User: "alice", Seq: 3}, {Key: "test/r", User: "bob", Seq: 4}}); err != nil {
		t.Fatal(err)
	}
	p := newPositions(n, st)
	// Announced by other nodes, not written yet: bob's above the store's,
	// alice's below it, carol's not stored at all.
	for _, j := range []posJob{{key: "test/r", user: "bob", seq: 6}, {key: "test/r", user: "alice", seq: 2}, {key: "test/r", user: "carol", seq: 5}} {
		j.seen = true
		p.do(j)
	}
	const want = `{"op":"receipts","room":"r","read":{"bob":6,"carol":5,"alice":3}}`
	if got := askReceipts(t, p, l, "test/r"); got != want {
		t.Fatal("alone:", got)
	}
	// The same users further on elsewhere, and many others in many rooms.
	for _, u := range []string{"alice", "bob", "carol", "dave"} {
		p.do(posJob{seen: true, key: "test/s", user: u, seq: 9})
	}
	for i := range 10_000 {
		p.do(posJob{seen: true, key: "test/o" + strconv.Itoa(i%100), user: "u" + strconv.Itoa(i), seq: uint64(i)})
	}
	if got := askReceipts(t, p, l, "test/r"); got != want {
		t.Fatal("among other rooms':", got)
	}
	if got := askReceipts(t, p, l, "test/s"); got != `{"op":"receipts","room":"s","read":{"alice":9,"bob":9,"carol":9,"dave":9}}` {
		t.Fatal("the other room:", got)
	}
}

// BenchmarkReceiptsQuery: one receipts query while other nodes' announced,
// unwritten marks fill the node's floor: 200,000 of them in 1,000 rooms
// (the cache's bound), 200 in the room asked.
func BenchmarkReceiptsQuery(b *testing.B) {
	st := persist.NewMemory(0)
	n, l := receiptsNode(b, st)
	p := newPositions(n, st)
	for r := range 1000 {
		key := "test/r" + strconv.Itoa(r)
		for u := range 200 {
			p.do(posJob{seen: true, key: key, user: "u" + strconv.Itoa(u), seq: uint64(u + 1)})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		askReceipts(b, p, l, "test/r500")
	}
}

// A mark on this node at or below the position another node announced and
// has not written yet keeps the user in the room's receipts answer, at the
// announced position: the answer shows the largest known position of
// every user with one in the room.
func TestReceiptsKeepsAnnouncedUnderLowerMark(t *testing.T) {
	st := persist.NewMemory(0)
	n, l := receiptsNode(t, st)
	commit(t, st, "test/r", 9)
	commit(t, st, "test/q", 5)
	p := newPositions(n, st)
	p.do(posJob{seen: true, key: "test/r", user: "carol", seq: 5})
	p.do(posJob{seen: true, key: "test/q", user: "carol", seq: 5})
	p.do(posJob{key: "test/r", user: "carol", seq: 3, m: &Member{}}) // below: the store is asked
	p.do(posJob{key: "test/q", user: "carol", seq: 5, m: &Member{}}) // the room's newest: it is not
	p.flushAnswers()
	l.mu.Lock()
	if len(l.evs) != 2 || l.evs[0].seq != 5 || l.evs[1].seq != 5 {
		t.Fatalf("the marks' answers: %+v", l.evs)
	}
	l.evs = nil
	l.mu.Unlock()
	if got := askReceipts(t, p, l, "test/r"); got != `{"op":"receipts","room":"r","read":{"carol":5}}` {
		t.Fatal("below the announced:", got)
	}
	if got := askReceipts(t, p, l, "test/q"); got != `{"op":"receipts","room":"q","read":{"carol":5}}` {
		t.Fatal("at the announced:", got)
	}
	// Moved past it here: the node's own move stands for it.
	p.do(posJob{key: "test/r", user: "carol", seq: 7, m: &Member{}})
	p.flushAnswers()
	l.mu.Lock()
	l.evs = nil
	l.mu.Unlock()
	if got := askReceipts(t, p, l, "test/r"); got != `{"op":"receipts","room":"r","read":{"carol":7}}` {
		t.Fatal("past it:", got)
	}
	if p.floor.n != 1 {
		t.Fatal("floor entries:", p.floor.n)
	}
}

// Moves are recorded for the receipts frames only in rooms a loop holds a
// receipts subscriber of, from the subscription on, and no longer once
// the last one left.
func TestReceiptsMovesOnlyWhereSubscribed(t *testing.T) {
	st := persist.NewMemory(0)
	n, _ := receiptsNode(t, st)
	tb := n.tables[0].Load()
	p := newPositions(n, st)
	move := func(user string, seq uint64) { p.do(posJob{seen: true, key: "test/r", user: user, seq: seq}) }
	move("alice", 1)
	if len(p.moved) != 0 {
		t.Fatal("recorded without a subscriber:", p.moved)
	}
	var a, b Member
	tb.SetReceipts(&a, "test/r", true)
	tb.SetReceipts(&b, "test/r", true)
	move("bob", 2)
	if p.moved["test/r"]["bob"] != 2 || len(p.moved["test/r"]) != 1 {
		t.Fatal("with subscribers:", p.moved)
	}
	tb.SetReceipts(&a, "test/r", false)
	move("carol", 3)
	if p.moved["test/r"]["carol"] != 3 {
		t.Fatal("with one subscriber left:", p.moved)
	}
	tb.dropReceipts(&b)
	tb.SetReceipts(&b, "test/r", false) // not subscribed: counts nothing
	clear(p.moved)
	move("dave", 4)
	if len(p.moved) != 0 || n.hasReceipts("test/r") || len(n.rcptRooms) != 0 {
		t.Fatal("after the last left:", p.moved, n.rcptRooms)
	}
}

// slowPositions is a memory store whose receipts reads wait for the test.
type slowPositions struct {
	*persist.Memory
	in   chan struct{} // a ReadPositions has begun
	gate chan struct{} // closed: they go on
}

func (s *slowPositions) ReadPositions(ctx context.Context, key string, limit int) ([]proto.Receipt, error) {
	s.in <- struct{}{}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Memory.ReadPositions(ctx, key, limit)
}

// A receipts query's store read runs off the positions goroutine: while
// it waits, a read mark in the room is answered; a flood of queries of
// the room past its worker's queue is answered overloaded, counted, and
// the marks still go on. The held query's answer, given back after the
// marks, holds them: a receipts frame may have told the asker meanwhile.
// Before the workers, the mark waited for the read.
func TestReceiptsLeaveMarksAlone(t *testing.T) {
	st := &slowPositions{Memory: persist.NewMemory(0), in: make(chan struct{}, queryQueue+8), gate: make(chan struct{})}
	n, l := receiptsNode(t, st)
	commit(t, st.Memory, "test/r", 9)
	if err := st.SaveReads(context.Background(), []persist.ReadMark{{Key: "test/r", User: "alice", Seq: 3}}); err != nil {
		t.Fatal(err)
	}
	tb := n.tables[0].Load()
	var asker, marker, flooder Member
	if !tb.Receipts(&asker, "test/r") {
		t.Fatal("receipts refused")
	}
	<-st.in // the asker's store read is under way, and held
	if !tb.MarkRead(&marker, "test/r", "y", 5) {
		t.Fatal("mark refused")
	}
	waitEvent(t, l, "answer to y's mark while the receipts read is held", func(ev *Event) bool {
		return ev.kind == evReadDone && ev.member == &marker && ev.seq == 5 && ev.err == nil
	})

	// A room's queries all go to one worker: one held, a queue full, then
	// refusals.
	floodRefused(t, tb, l, &flooder, &marker, func() bool { return tb.Receipts(&flooder, "test/r") },
		doneReceipts, "cannot read the room's receipts now", &n.Stats.ReceiptsRefused)

	close(st.gate)
	ev := waitEvent(t, l, "the asker's receipts answer", func(ev *Event) bool {
		return ev.kind == evReadDone && ev.member == &asker
	})
	want := `{"op":"receipts","room":"r","read":{"y":7,"alice":3}}`
	if f, _ := proto.ServerFramePayload(ev.frame); ev.err != nil || string(f) != want {
		t.Fatalf("the asker's receipts: %s (%v), want %s", f, ev.err, want)
	}
	// Every query of the flood not refused is answered, and the node's
	// count of those out comes back to none.
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		answered, refused := 0, 0
		for _, ev := range l.evs {
			if ev.kind == evReadDone && ev.member == &flooder {
				if ev.err != nil {
					refused++
				} else {
					answered++
				}
			}
		}
		l.mu.Unlock()
		if answered+refused == queryQueue+2 && uint64(refused) == n.Stats.ReceiptsRefused.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flood: %d answered, %d refused, of %d", answered, refused, queryQueue+2)
		}
		time.Sleep(time.Millisecond)
	}
}

// roomState finds a room's handed-over marks by binary search of
// sentMarks rather than by walking them: after moves, hand-overs that
// leave marks untaken and commits that give some back, it holds exactly
// the room's entries of dirty, sentMarks and the floor; each part of
// sentMarks is in order with one mark per position.
func TestRoomStateIsTheRoomsEntries(t *testing.T) {
	st := persist.NewMemory(0)
	n, _ := receiptsNode(t, st)
	p := newPositions(n, st)
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() string { return "test/r" + strconv.Itoa(rng.IntN(7)) }
	user := func() string { return "u" + strconv.Itoa(rng.IntN(40)) }
	now := time.Now()
	for round := range 60 {
		for range rng.IntN(50) {
			p.do(posJob{own: true, key: key(), user: user(), seq: uint64(1 + rng.IntN(100))})
		}
		for range rng.IntN(5) {
			p.do(posJob{seen: true, key: key(), user: user(), seq: uint64(1 + rng.IntN(100))})
		}
		switch rng.IntN(4) {
		case 0: // a hand-over no commit takes: its marks go first at the next
			p.handOver()
		case 1: // a commit takes some and fails: given back
			p.handOver()
			now = now.Add(time.Second)
			p.hand.done(p.hand.takeAt(now), false)
		case 2: // a commit takes some and writes them
			p.handOver()
			now = now.Add(time.Second)
			ms := p.hand.takeAt(now)
			if err := st.SaveReads(context.Background(), ms); err != nil {
				t.Fatal(err)
			}
			p.hand.done(ms, true)
		}
		for _, part := range [][]persist.ReadMark{p.sentMarks[:p.sentDue], p.sentMarks[p.sentDue:]} {
			if !slices.IsSortedFunc(part, compareMarks) || len(slices.CompactFunc(slices.Clone(part), func(a, b persist.ReadMark) bool { return compareMarks(a, b) == 0 })) != len(part) {
				t.Fatalf("round %d: sentMarks out of order or with a position twice: %v", round, part)
			}
		}
		for r := range 7 {
			k := "test/r" + strconv.Itoa(r)
			want := map[string]uint64{}
			for pk, seq := range p.dirty {
				if pk.key == k {
					want[pk.user] = max(want[pk.user], seq)
				}
			}
			for _, m := range p.sentMarks {
				if m.Key == k {
					want[m.User] = max(want[m.User], m.Seq)
				}
			}
			for u, seq := range p.floor.rooms[k] {
				want[u] = max(want[u], seq)
			}
			got := map[string]uint64{}
			for _, m := range p.roomState(k, nil) {
				got[m.User] = max(got[m.User], m.Seq)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("round %d, %s: roomState %v, want %v", round, k, got, want)
			}
		}
	}
}
