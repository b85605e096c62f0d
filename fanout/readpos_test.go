package fanout

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// The announced positions' broker payload: what appendReadEntry writes,
// readEntries reads back, entry by entry; a cut or garbled payload yields
// whole entries only and never panics.
func FuzzReadEntries(f *testing.F) {
	one := appendReadEntry(nil, proto.RoomKey("app", "r"), "alice", 7, signalBit|1, false)
	two := appendReadEntry(append([]byte(nil), one...), proto.RoomKey("app", "room-2"), "bob", 1<<40, signalBit|2, true)
	f.Add(one)
	f.Add(two)
	f.Add(two[:len(two)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var again []byte
		k := 0
		readEntries(b, func(tag uint64, own bool, userKey, frame []byte) {
			if len(userKey) > len(b) || len(frame) > len(b) {
				t.Fatalf("entry larger than its payload")
			}
			payload, _ := proto.ServerFramePayload(frame)
			if room, seq, ok := proto.ReadFrameOf(payload); ok {
				app, user, _ := bytes.Cut(userKey, []byte("/"))
				again = appendReadEntry(again, proto.RoomKey(string(app), room), string(user), seq, tag, own)
				k++
			}
		})
		// Entries that parse as read frames are written again whole.
		n := 0
		readEntries(again, func(uint64, bool, []byte, []byte) { n++ })
		if n != k {
			t.Fatalf("%d entries written again, %d read back", k, n)
		}
	})
}

func TestReadEntriesRoundTrip(t *testing.T) {
	b := appendReadEntry(nil, proto.RoomKey("app", "r"), "alice", 7, signalBit|1, false)
	b = appendReadEntry(b, proto.RoomKey("app", "s"), "bob", 9, signalBit|2, true)
	var got []string
	readEntries(b, func(tag uint64, own bool, userKey, frame []byte) {
		payload, _ := proto.ServerFramePayload(frame)
		room, seq, ok := proto.ReadFrameOf(payload)
		if !ok {
			t.Fatalf("not a read frame: %q", payload)
		}
		got = append(got, string(userKey)+" "+room+" "+string(rune('0'+seq))+map[bool]string{true: " own", false: ""}[own])
		if tag&^signalBit == 0 {
			t.Fatal("tag lost")
		}
	})
	if len(got) != 2 || got[0] != "app/alice r 7" || got[1] != "app/bob s 9 own" {
		t.Fatalf("round trip: %q", got)
	}
}

// A second's marks are taken by the commits of the second a share each,
// by the time since the offer, all of them by readsSpread; what no commit
// took goes first at the next offer, due at once and merged with the
// newer moves of the same positions, the rest in (room, user) order.
func TestReadHandoffPaced(t *testing.T) {
	p := newPositions(&Node{}, persist.NewMemory(0))
	for i := range 1000 {
		p.dirty[posKey{proto.RoomKey("app", fmt.Sprintf("r%03d", i%10)), fmt.Sprintf("u%04d", i)}] = uint64(i + 1)
	}
	if !p.handOver() {
		t.Fatal("nothing handed over")
	}
	h := p.hand
	t0 := h.at
	if m := h.takeAt(t0); len(m) != 0 {
		t.Fatalf("%d marks taken at the offer", len(m))
	}
	var got []persist.ReadMark
	for _, el := range []time.Duration{readsSpread / 10, readsSpread / 10, readsSpread / 2, readsSpread * 3 / 4} {
		m := h.takeAt(t0.Add(el))
		got = append(got, m...)
		if want := int((1000*int64(el) + int64(readsSpread) - 1) / int64(readsSpread)); len(got) != want {
			t.Fatalf("at %v: %d taken in all, want %d", el, len(got), want)
		}
	}
	if !slices.IsSortedFunc(got, func(a, b persist.ReadMark) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.User, b.User))
	}) {
		t.Fatal("not taken in (room, user) order")
	}
	// A commit fails with the last share; the rest is not taken this
	// second. The next offer leads with both, due at once, one mark per
	// position with its newest move.
	last := h.takeAt(t0.Add(readsSpread * 4 / 5))
	h.done(last, false)
	k := posKey{last[0].Key, last[0].User}
	p.dirty[k] = last[0].Seq + 5000
	p.dirty[posKey{proto.RoomKey("app", "r999"), "new"}] = 1
	left := 1000 - len(got)
	p.handOver()
	t1 := h.at
	now := h.takeAt(t1)
	if len(now) != left {
		t.Fatalf("%d taken at the offer, want the %d left from the last", len(now), left)
	}
	seen := map[posKey]bool{}
	for _, m := range now {
		mk := posKey{m.Key, m.User}
		if seen[mk] {
			t.Fatalf("%v twice in one offer", mk)
		}
		seen[mk] = true
		if mk == k && m.Seq != last[0].Seq+5000 {
			t.Fatalf("%v: seq %d, want its newest move %d", mk, m.Seq, last[0].Seq+5000)
		}
		if m.User == "new" {
			t.Fatal("a fresh move due at once")
		}
	}
	if rest := h.takeAt(t1.Add(readsSpread)); len(rest) != 1 || rest[0].User != "new" {
		t.Fatalf("then %v, want the fresh move", rest)
	}
	if h.offered.Load() || h.takeAt(t1.Add(2*readsSpread)) != nil {
		t.Fatal("marks left after all were taken")
	}
}

// A commit that fails after a later offer of the same position gives back
// the older mark while the newer waits untaken: the next hand-over holds
// the position once, with the larger seq, due at once, and the cache's
// eviction keeps it.
func TestHandOverTakesAPositionOnce(t *testing.T) {
	p := newPositions(&Node{}, persist.NewMemory(0))
	k := posKey{proto.RoomKey("app", "r"), "u"}
	other := posKey{proto.RoomKey("app", "a"), "v"}
	p.dirty[k] = 5
	p.handOver()
	h := p.hand
	taken := h.takeAt(h.at.Add(readsSpread))
	if len(taken) != 1 || taken[0].Seq != 5 {
		t.Fatalf("taken %v, want u at 5", taken)
	}
	p.dirty[k], p.dirty[other] = 7, 3
	p.handOver() // u at 7 and v at 3 offered, not taken yet
	h.done(taken, false)
	p.handOver()
	want := []persist.ReadMark{{Key: other.key, User: "v", Seq: 3}, {Key: k.key, User: "u", Seq: 7}}
	if !slices.Equal(p.sentMarks, want) || p.sentDue != 2 {
		t.Fatalf("handed over %v (%d due), want %v all due", p.sentMarks, p.sentDue, want)
	}
	// The cache's eviction keeps what was handed over, as cached, and
	// forgets clean positions down to posEvictTo.
	p = newPositions(&Node{}, persist.NewMemory(0))
	for i := range 1000 {
		p.dirty[posKey{k.key, "h" + strconv.Itoa(i)}] = uint64(i + 1)
	}
	p.handOver()
	for i := range 1000 {
		p.pos[posKey{k.key, "h" + strconv.Itoa(i)}] = uint64(i + 1)
	}
	for i := range posCacheMax - 1000 {
		p.pos[posKey{k.key, "w" + strconv.Itoa(i)}] = 9
	}
	p.evict()
	if len(p.pos) > posEvictTo || len(p.pos) < posEvictTo-1000 {
		t.Fatalf("after eviction %d positions, want %d or up to 1,000 less", len(p.pos), posEvictTo)
	}
	for i := range 1000 {
		if c := (posKey{k.key, "h" + strconv.Itoa(i)}); p.pos[c] != uint64(i+1) {
			t.Fatalf("after eviction %v at %d, want %d", c, p.pos[c], i+1)
		}
	}
}

// A loop's read marks and requests go to the positions goroutine in one
// batch when the loop flushes them (the end of its wake-up), and their
// answers come back in one PostAll, in the order asked: an unread request
// after a mark of the same user counts from that mark.
func TestReadMarksGoTogether(t *testing.T) {
	st := persist.NewMemory(0)
	n, l := receiptsNode(t, st)
	commit(t, st, "test/r", 9)
	tb := n.tables[0].Load()
	soon := 0
	tb.SetPositionsSoon(func() { soon++ })
	const marks = 50
	ms := make([]Member, marks+1)
	for i := range marks {
		if !tb.MarkRead(&ms[i], "test/r", "u"+strconv.Itoa(i), uint64(i%9+1)) {
			t.Fatal("mark refused", i)
		}
	}
	if !tb.MarkRead(&ms[marks], "test/r", "x", 5) || !tb.Unread(&ms[marks], "test", "x", []string{"r"}) {
		t.Fatal("refused")
	}
	if soon != 1 || len(tb.posOut) != marks+2 || n.pos.inLen.Load() != 0 {
		t.Fatalf("before the flush: soon %d, gathered %d, given %d", soon, len(tb.posOut), n.pos.inLen.Load())
	}
	tb.FlushPositions()
	if len(tb.posOut) != 0 {
		t.Fatal("gathered after the flush:", len(tb.posOut))
	}
	readAnswers(t, l, marks+2)
	l.mu.Lock()
	defer l.mu.Unlock()
	// The rest are the moves' announcements (evUserFrame), posted apart,
	// and the unread answer, which an unread worker posts itself.
	var answers []Event
	var unread *Event
	for i, ev := range l.evs {
		switch {
		case ev.kind == evReadDone && ev.key == "test":
			unread = &l.evs[i]
		case ev.kind == evReadDone:
			answers = append(answers, ev)
		}
	}
	if len(answers) != marks+1 || l.posts != 1 || unread == nil {
		t.Fatalf("answers %d in %d PostAlls, want %d in 1, and the unread one (%v)", len(answers), l.posts, marks+1, unread != nil)
	}
	for i := range marks {
		if ev := answers[i]; ev.member != &ms[i] || ev.seq != uint64(i%9+1) || ev.err != nil {
			t.Fatalf("answer %d: member %p seq %d err %v", i, ev.member, ev.seq, ev.err)
		}
	}
	if ev := answers[marks]; ev.member != &ms[marks] || ev.seq != 5 {
		t.Fatalf("x's mark: %+v", ev)
	}
	want := `{"op":"unread","rooms":{"r":{"read":5,"seq":9,"count":4}}}`
	if f, _ := proto.ServerFramePayload(unread.frame); unread.member != &ms[marks] || string(f) != want {
		t.Fatalf("x's unread: %s, want %s", f, want)
	}
}

// slowReads is a memory store whose unread counts wait for the test.
type slowReads struct {
	*persist.Memory
	in   chan struct{} // an Unread has begun
	gate chan struct{} // closed: Unreads go on
}

func (s *slowReads) Unread(ctx context.Context, keys []string, user string, last, read, count []uint64) error {
	s.in <- struct{}{}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Memory.Unread(ctx, keys, user, last, read, count)
}

// floodRefused asks queryQueue+2 queries with ask while one of the same
// worker's reads is held: the flooder gets an overloaded answer told as
// the query's failure (flag, text), the refusal is counted, and the
// marker's mark is still answered meanwhile.
func floodRefused(t *testing.T, tb *Table, l *testLoop, flooder, marker *Member, ask func() bool, flag uint8, text string, counted *atomic.Uint64) {
	t.Helper()
	for range queryQueue + 2 {
		if !ask() {
			t.Fatal("query refused by the positions queue")
		}
	}
	refused := waitEvent(t, l, "overloaded answer to the flood", func(ev *Event) bool {
		return ev.kind == evReadDone && ev.member == flooder && errors.Is(ev.err, proto.ErrOverloaded) && ev.flags&flag != 0
	})
	tb.Run(&refused) // told as the query's failure, not a mark's
	if out := bytes.Join(flooder.Out.Pending(), nil); !bytes.Contains(out, []byte(`"code":"overloaded"`)) || !bytes.Contains(out, []byte(text)) {
		t.Fatalf("the refused query's answer: %s", out)
	}
	if counted.Load() == 0 {
		t.Fatal("refusal not counted")
	}
	if !tb.MarkRead(marker, "test/r", "y", 7) {
		t.Fatal("mark refused")
	}
	waitEvent(t, l, "answer to y's second mark during the flood", func(ev *Event) bool {
		return ev.kind == evReadDone && ev.member == marker && ev.seq == 7
	})
}

// waitEvent waits for an event the loop got that ok accepts.
func waitEvent(t *testing.T, l *testLoop, what string, ok func(*Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for i := range l.evs {
			if ok(&l.evs[i]) {
				ev := l.evs[i]
				l.mu.Unlock()
				return ev
			}
		}
		l.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no", what)
	return Event{}
}

// An unread request's store read runs off the positions goroutine: while
// it waits, another user's read mark is answered; a user flooding unread
// requests past its worker's queue is answered overloaded, counted, and
// the marks still go on. Before the workers, the mark waited for the read.
func TestUnreadLeavesMarksAlone(t *testing.T) {
	st := &slowReads{Memory: persist.NewMemory(0), in: make(chan struct{}, queryQueue+8), gate: make(chan struct{})}
	n, l := receiptsNode(t, st)
	commit(t, st.Memory, "test/r", 9)
	tb := n.tables[0].Load()
	var asker, marker, flooder Member
	if !tb.Unread(&asker, "test", "x", []string{"r"}) {
		t.Fatal("unread refused")
	}
	<-st.in // x's store read is under way, and held
	if !tb.MarkRead(&marker, "test/r", "y", 5) {
		t.Fatal("mark refused")
	}
	waitEvent(t, l, "answer to y's mark while x's unread is held", func(ev *Event) bool {
		return ev.kind == evReadDone && ev.member == &marker && ev.seq == 5 && ev.err == nil
	})

	// One user's requests all go to one worker: one held, a queue full,
	// then refusals.
	floodRefused(t, tb, l, &flooder, &marker, func() bool { return tb.Unread(&flooder, "test", "x", []string{"r"}) },
		doneUnread, "cannot read unread counts now", &n.Stats.UnreadRefused)

	close(st.gate)
	ev := waitEvent(t, l, "x's unread answer", func(ev *Event) bool {
		return ev.kind == evReadDone && ev.member == &asker
	})
	want := `{"op":"unread","rooms":{"r":{"read":0,"seq":9,"count":9}}}`
	if f, _ := proto.ServerFramePayload(ev.frame); ev.err != nil || string(f) != want {
		t.Fatalf("x's unread: %s (%v), want %s", f, ev.err, want)
	}
}

// BenchmarkPositionsEvict: one eviction from a full cache (posCacheMax
// positions, down to posEvictTo) with 10,000 marks handed over, the
// positions goroutine's longest pause between two jobs (evict).
func BenchmarkPositionsEvict(b *testing.B) {
	p := newPositions(&Node{}, persist.NewMemory(0))
	keys := make([]posKey, posCacheMax)
	for i := range keys {
		keys[i] = posKey{proto.RoomKey("app", "r"+strconv.Itoa(i%1000)), "u" + strconv.Itoa(i)}
	}
	for j := range 10000 {
		p.dirty[keys[j*7]] = 2
	}
	p.handOver()
	for b.Loop() {
		b.StopTimer()
		for _, k := range keys {
			p.pos[k] = 1
		}
		b.StartTimer()
		p.evict()
	}
	if len(p.pos) > posEvictTo {
		b.Fatalf("%d positions kept, want at most %d", len(p.pos), posEvictTo)
	}
}

// A loop's marks beyond what the positions goroutine knows of their rooms
// (rooms another node publishes in and no loop here delivers) are looked
// up in the store together, one read for the batch: marks up to a room's
// newest are taken, marks beyond it and marks of a room not stored are
// refused, and a later batch within what was read asks nothing.
func TestReadMarksLookedUpTogether(t *testing.T) {
	st := persist.NewMemory(0)
	n, l := receiptsNode(t, st)
	const rooms = 5
	for r := range rooms {
		commit(t, st, "test/r"+strconv.Itoa(r), 3)
	}
	mk := newMarks(t, n, l)
	for r := range rooms {
		key := "test/r" + strconv.Itoa(r)
		mk.mark(key, "u", 3, markWant{seq: 3})
		mk.mark(key, "v", 9, markWant{err: ErrReadBeyond})
	}
	mk.mark("test/none", "u", 1, markWant{err: ErrReadBeyond})
	mk.check()
	if c, r := n.Stats.ReadMarksChecked.Load(), n.Stats.ReadLookups.Load(); c != uint64(len(mk.wants)) || r != 1 {
		t.Fatalf("%d marks checked in %d store reads, want %d in 1", c, r, len(mk.wants))
	}
	mk.mark("test/r0", "w", 2, markWant{seq: 2})
	mk.check()
	if r := n.Stats.ReadLookups.Load(); r != 1 {
		t.Fatalf("a mark within what was read read the store: %d reads", r)
	}
}

// A loop's first marks of users whose positions the node does not hold,
// below their rooms' newest seqs, read the stored positions together: one
// store read for the batch, each answered with the larger of the stored
// position and its mark; a mark alone reads alone.
func TestStoredPositionsLookedUpTogether(t *testing.T) {
	const rooms = 5
	_, n, l := storedAt2(t, rooms)
	mk := newMarks(t, n, l)
	for r := range rooms {
		key := "test/r" + strconv.Itoa(r)
		mk.mark(key, "u", 1, markWant{seq: 2}) // behind the stored 2
		mk.mark(key, "v", 1, markWant{seq: 1}) // none stored
	}
	mk.check()
	if r := n.Stats.ReadPositionLookups.Load(); r != 1 {
		t.Fatalf("%d marks' stored positions in %d store reads, want 1", 2*rooms, r)
	}
	mk.mark("test/r0", "w", 2, markWant{seq: 2})
	mk.check()
	if r := n.Stats.ReadPositionLookups.Load(); r != 2 {
		t.Fatalf("a mark alone: %d store reads of positions in all, want 2", r)
	}
}

// A failed look-up of a loop's marks leaves each to ask the store itself,
// as a mark alone does: each answers the store's error (not "beyond"),
// counted checked once.
func TestReadMarksLookUpFails(t *testing.T) {
	st := openPG(t, pgtest.NewDB(t), persist.PGConfig{})
	n, l := receiptsNode(t, st)
	tb := n.tables[0].Load()
	tb.SetPositionsSoon(func() {})
	st.Close() // every read fails from here
	ms := make([]Member, 2)
	for i := range ms {
		if !tb.MarkRead(&ms[i], "test/r"+strconv.Itoa(i), "u", 1) {
			t.Fatal("mark refused")
		}
	}
	tb.FlushPositions()
	for i, ev := range readAnswers(t, l, len(ms)) {
		if ev.err == nil || errors.Is(ev.err, ErrReadBeyond) {
			t.Fatalf("answer %d: err %v, want the store's", i, ev.err)
		}
	}
	if c, r := n.Stats.ReadMarksChecked.Load(), n.Stats.ReadLookups.Load(); c != 2 || r != 3 {
		t.Fatalf("%d marks checked in %d store reads, want 2 in 3 (the batch's, then one each)", c, r)
	}
}

// A failed read of a batch's stored positions leaves each mark to read its
// own, as a mark alone does, and to answer the store's error: the
// batch's read, then one each.
func TestStoredPositionsLookUpFails(t *testing.T) {
	st := openPG(t, pgtest.NewDB(t), persist.PGConfig{})
	n, l := receiptsNode(t, st)
	const rooms = 3
	mk := newMarks(t, n, l)
	for r := range rooms {
		key := "test/r" + strconv.Itoa(r)
		commit(t, st, key, 3)
		mk.mark(key, "warm", 3, markWant{seq: 3}) // the rooms' newest seqs known
	}
	mk.check()
	st.Close() // every read fails from here
	for r := range rooms {
		if !mk.tb.MarkRead(&mk.ms[rooms+r], "test/r"+strconv.Itoa(r), "u", 1) {
			t.Fatal("mark refused")
		}
	}
	mk.tb.FlushPositions()
	for i, ev := range readAnswers(t, l, 2*rooms)[rooms:] {
		if ev.err == nil || errors.Is(ev.err, ErrReadBeyond) {
			t.Fatalf("answer %d: seq %d err %v, want the store's error", i, ev.seq, ev.err)
		}
	}
	if r := n.Stats.ReadPositionLookups.Load(); r != 1+rooms {
		t.Fatalf("%d store reads of positions, want %d (the batch's, then one each)", r, 1+rooms)
	}
}

// marks gives a node's first loop read marks, each from a Member of its
// own, and checks their answers against what each should be.
// storedAt2 is a node on a memory store of rooms test/r0, test/r1, ... of
// 3 messages each, in each of which user u's position is stored at 2.
func storedAt2(t *testing.T, rooms int) (*persist.Memory, *Node, *testLoop) {
	st := persist.NewMemory(0)
	n, l := receiptsNode(t, st)
	var saved []persist.ReadMark
	for r := range rooms {
		key := "test/r" + strconv.Itoa(r)
		commit(t, st, key, 3)
		saved = append(saved, persist.ReadMark{Key: key, User: "u", Seq: 2})
	}
	if err := st.SaveReads(context.Background(), saved); err != nil {
		t.Fatal(err)
	}
	return st, n, l
}

// The Server API's marks waiting together on the jobs channel read the
// store together, as a loop's marks do: the rooms' newest seqs in one
// read, the users' stored positions in another, however many marks; a
// mark beyond its room's newest is refused on that read's answer.
// Taken one at a time, these 15 marks read the store 20 times.
func TestAPIMarksLookedUpTogether(t *testing.T) {
	const rooms = 5
	st, n, _ := storedAt2(t, rooms)
	p := newPositions(n, st) // not running: the test takes its jobs
	var replies []chan posReply
	var wants []markWant
	ask := func(key, user string, seq uint64, w markWant) {
		r := make(chan posReply, 1)
		p.jobs <- posJob{key: key, user: user, seq: seq, ask: &posAsk{reply: r}}
		replies = append(replies, r)
		wants = append(wants, w)
	}
	for r := range rooms {
		key := "test/r" + strconv.Itoa(r)
		ask(key, "u", 1, markWant{seq: 2}) // behind the stored 2
		ask(key, "v", 1, markWant{seq: 1}) // none stored
		ask(key, "w", 4, markWant{err: ErrReadBeyond})
	}
	p.takeJobs(<-p.jobs, len(p.jobs))
	for i, r := range replies {
		select {
		case got := <-r:
			if got.seq != wants[i].seq || !errors.Is(got.err, wants[i].err) {
				t.Fatalf("mark %d: seq %d err %v, want %d %v", i, got.seq, got.err, wants[i].seq, wants[i].err)
			}
		default:
			t.Fatalf("mark %d not answered", i)
		}
	}
	if l, s := n.Stats.ReadLookups.Load(), n.Stats.ReadPositionLookups.Load(); l != 1 || s != 1 {
		t.Fatalf("%d API marks: the rooms' newest seqs in %d store reads, the stored positions in %d; want 1 and 1", len(replies), l, s)
	}
}

type marks struct {
	t     *testing.T
	tb    *Table
	l     *testLoop
	ms    [64]Member
	wants []markWant
}

// markWant is what a mark's answer should be.
type markWant struct {
	seq uint64
	err error
}

func newMarks(t *testing.T, n *Node, l *testLoop) *marks {
	tb := n.tables[0].Load()
	tb.SetPositionsSoon(func() {})
	return &marks{t: t, tb: tb, l: l}
}

func (mk *marks) mark(key, user string, seq uint64, w markWant) {
	mk.t.Helper()
	if !mk.tb.MarkRead(&mk.ms[len(mk.wants)], key, user, seq) {
		mk.t.Fatal("mark refused")
	}
	mk.wants = append(mk.wants, w)
}

// check hands the marks over and waits for every answer.
func (mk *marks) check() {
	mk.t.Helper()
	mk.tb.FlushPositions()
	for i, ev := range readAnswers(mk.t, mk.l, len(mk.wants)) {
		if w := mk.wants[i]; ev.member != &mk.ms[i] || ev.seq != w.seq || !errors.Is(ev.err, w.err) {
			mk.t.Fatalf("answer %d: member %p seq %d err %v, want %+v", i, ev.member, ev.seq, ev.err, w)
		}
	}
}

// readAnswers waits for k answers to read marks (or requests) posted to l
// and returns those there are then, in the order posted. It counts before
// it copies, so that a benchmark waiting on it pays little for the wait.
func readAnswers(tb testing.TB, l *testLoop, k int) []Event {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		n := 0
		for _, ev := range l.evs {
			if ev.kind == evReadDone {
				n++
			}
		}
		if n >= k {
			got := make([]Event, 0, n)
			for _, ev := range l.evs {
				if ev.kind == evReadDone {
					got = append(got, ev)
				}
			}
			l.mu.Unlock()
			return got
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			tb.Fatalf("%d answers, want %d", n, k)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// A delivered mark (at or below what its loop delivered) skips the check
// against the room's newest seq but not the stored position: with the
// user's stored position ahead of the mark, the answer is the stored one.
// When a delivered mark raised the room's newest seq to itself (before
// 8cd632a), a mark at that seq took the "marked up to the newest" path,
// which skips the store, and was answered as the mark's seq.
func TestDeliveredMarkBehindStoredPosition(t *testing.T) {
	st := persist.NewMemory(0)
	commit(t, st, "test/r", 9)
	if err := st.SaveReads(context.Background(), []persist.ReadMark{{Key: "test/r", User: "u", Seq: 5}}); err != nil {
		t.Fatal(err)
	}
	n, l := receiptsNode(t, st)
	var m Member
	n.pos.jobs <- posJob{key: "test/r", user: "u", seq: 3, m: &m, delivered: true}
	if ev := readAnswers(t, l, 1)[0]; ev.seq != 5 || ev.err != nil {
		t.Fatalf("answer seq %d err %v, want the stored 5", ev.seq, ev.err)
	}
	if c := n.Stats.ReadMarksChecked.Load(); c != 0 {
		t.Fatalf("a delivered mark checked against the store %d times", c)
	}
}

// BenchmarkFirstMarksPG: the time a node takes to answer users' first
// marks below their rooms' newest seqs (the positions goroutine needs each
// one's stored position), with PostgreSQL: 1,000 marks over 100 rooms
// handed over in one batch, as one event-loop wake-up hands them over.
// ns/mark is per mark; before lookUpStored each was a store read of its
// own in turn (bench notes, "Stored positions read together").
func BenchmarkFirstMarksPG(b *testing.B) {
	st, saved := firstMarksStore(b)
	ms := make([]Member, len(saved))
	for b.Loop() {
		b.StopTimer()
		n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 2}, Parts{Store: st, Pool: PoolConfig{Window: -1}})
		if err != nil {
			b.Fatal(err)
		}
		l := &testLoop{}
		n.NewTable(0, l)
		tb := n.tables[0].Load()
		tb.SetPositionsSoon(func() {})
		// The rooms' newest seqs known, as a node delivering them knows them.
		for r := range firstMarksRooms {
			tb.MarkRead(&ms[r], "test/r"+strconv.Itoa(r), "warm", 3)
		}
		tb.FlushPositions()
		readAnswers(b, l, firstMarksRooms)
		b.StartTimer()
		for i, m := range saved {
			if !tb.MarkRead(&ms[i], m.Key, m.User, 1) {
				b.Fatal("mark refused")
			}
		}
		tb.FlushPositions()
		readAnswers(b, l, firstMarksRooms+len(saved))
		b.StopTimer()
		_ = n.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(saved)), "ns/mark")
}

// The first marks' benchmarks' rooms, and users marking in each.
const firstMarksRooms, firstMarksUsers = 100, 10

// firstMarksStore is the store of the first marks' benchmarks: rooms of 3
// messages, users in each with a stored position at 2; it answers the
// marks to send, room by room.
func firstMarksStore(b *testing.B) (*persist.Postgres, []persist.ReadMark) {
	url := pgtest.NewDB(b)
	st := openPG(b, url, persist.PGConfig{})
	b.Cleanup(st.Close)
	var saved []persist.ReadMark
	for r := range firstMarksRooms {
		key := "test/r" + strconv.Itoa(r)
		for i := range 3 {
			row := &persist.Row{Key: key, From: "bob", ID: []byte("x-" + strconv.Itoa(i)), Body: []byte("1")}
			if err := st.CommitBatch(context.Background(), []*persist.Row{row}); err != nil || row.Err != nil {
				b.Fatal(err, row.Err)
			}
		}
		for u := range firstMarksUsers {
			saved = append(saved, persist.ReadMark{Key: key, User: "u" + strconv.Itoa(u), Seq: 2})
		}
	}
	if err := st.SaveReads(context.Background(), saved); err != nil {
		b.Fatal(err)
	}
	return st, saved
}

// BenchmarkAPIMarksPG: the time a node takes to answer 1,000 Server API
// marks in flight together (one goroutine each, as net/http serves
// them), users' first marks below their rooms' newest seqs, with
// PostgreSQL. ns/mark is per mark; before takeJobs each read the store
// alone, in turn (bench notes, "API marks read together").
func BenchmarkAPIMarksPG(b *testing.B) {
	st, saved := firstMarksStore(b)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 2}, Parts{Store: st, Pool: PoolConfig{Window: -1}})
		if err != nil {
			b.Fatal(err)
		}
		for r := 0; r < len(saved); r += firstMarksUsers { // the rooms' newest seqs known
			if _, err := n.MarkRead(ctx, saved[r].Key, "warm", 3); err != nil {
				b.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var bad atomic.Int64
		b.StartTimer()
		for _, m := range saved {
			wg.Go(func() {
				if seq, err := n.MarkRead(ctx, m.Key, m.User, 1); err != nil || seq != 2 {
					bad.Add(1)
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		_ = n.Close()
		if bad.Load() > 0 {
			b.Fatalf("%d marks not answered their stored 2", bad.Load())
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(saved)), "ns/mark")
}
