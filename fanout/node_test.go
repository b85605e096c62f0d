package fanout

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// testLoop is a loop driven by the test: Post queues, pump runs what was
// posted on the test's goroutine (as a loop runs its inbox).
type testLoop struct {
	mu    sync.Mutex
	evs   []Event
	posts int // PostAll calls
}

func (l *testLoop) Post(ev Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *testLoop) PostAll(evs []Event) {
	l.mu.Lock()
	l.evs = append(l.evs, evs...)
	l.posts++
	l.mu.Unlock()
}

func (l *testLoop) Now() int64 { return time.Now().UnixMilli() }

// runPosted runs the events posted so far, as one wake-up of the loop,
// and returns how many it ran.
func (l *testLoop) runPosted(tb *Table) int {
	l.mu.Lock()
	evs := l.evs
	l.evs = nil
	l.mu.Unlock()
	for i := range evs {
		tb.Run(&evs[i])
	}
	return len(evs)
}

// pump runs posted events (and the gap check of each flush tick) until
// done holds.
func (l *testLoop) pump(t *testing.T, tb *Table, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("state not reached in time")
		}
		if l.runPosted(tb) == 0 {
			time.Sleep(time.Millisecond)
			tb.CheckGaps()
		}
	}
}

// acks records the outcome of each publish (Origin).
type acks struct {
	mu  sync.Mutex
	got map[string]uint64 // id -> seq
	err []error
}

func (a *acks) Published(req *PubRequest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if req.Err != nil {
		a.err = append(a.err, req.Err)
		return
	}
	a.got[string(req.ID)] = req.Seq
}

func (a *acks) n() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.got) + len(a.err)
}

func testNode(t *testing.T, store persist.Store) (*Node, *Table, *testLoop) {
	t.Helper()
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 2, GapWindow: 10 * time.Millisecond},
		Parts{Store: store, Pool: PoolConfig{Window: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	l := &testLoop{}
	return n, n.NewTable(0, l), l
}

// seqs lists the seq of every msg frame queued for m, in order.
func seqs(m *Member) []int {
	var out []int
	for _, f := range m.Out.Pending() {
		i := bytes.Index(f, []byte(`"op":"msg"`))
		j := bytes.Index(f, []byte(`"seq":`))
		if i < 0 || j < 0 {
			continue
		}
		k := j + len(`"seq":`)
		n := 0
		for ; k < len(f) && f[k] >= '0' && f[k] <= '9'; k++ {
			n = n*10 + int(f[k]-'0')
		}
		out = append(out, n)
	}
	return out
}

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPublishWalk: a publish walks fanout -> store -> fanout -> broker ->
// fanout -> the loop's member, and its source hears the seq.
func TestPublishWalk(t *testing.T) {
	n, tb, l := testNode(t, persist.NewMemory(100))
	key := proto.RoomKey("app", "r")
	m := member(&testOwner{})
	if err := tb.Join(m, []byte(key), Resume{}); err != nil {
		t.Fatal(err)
	}
	l.pump(t, tb, func() bool { return m.Rooms() == 1 })
	if err := tb.Join(m, []byte(key), Resume{}); err != ErrJoined {
		t.Fatalf("second join: %v, want ErrJoined", err)
	}
	src := &acks{got: map[string]uint64{}}
	for i := 1; i <= 3; i++ {
		req := GetPubRequest()
		req.Key, req.From, req.Origin = key, "alice", src
		req.ID = append(req.ID, "m-"+strconv.Itoa(i)...)
		req.Body = append(req.Body, strconv.Itoa(i)...)
		if err := n.Publish(req); err != nil {
			t.Fatal(err)
		}
	}
	l.pump(t, tb, func() bool { return src.n() == 3 && len(seqs(m)) == 3 })
	if !sameInts(seqs(m), []int{1, 2, 3}) || src.got["m-1"] != 1 || src.got["m-3"] != 3 {
		t.Fatalf("delivered %v, acked %v", seqs(m), src.got)
	}
	if got := n.Stats.Joined.Load(); got != 1 {
		t.Fatalf("joined %d, want 1", got)
	}
	tb.Close(m)
	if got := n.Stats.Joined.Load(); got != 0 || n.Rooms() != 0 {
		t.Fatalf("after Close: joined %d rooms %d", got, n.Rooms())
	}
}

// commit stores count messages of key directly (as another node's
// publishes would be) and returns their frames by seq.
func commit(t *testing.T, st persist.Store, key string, count int) map[int][]byte {
	t.Helper()
	frames := map[int][]byte{}
	_, room := proto.SplitKey(key)
	for i := 0; i < count; i++ {
		req := &persist.Row{Key: key, From: "bob", ID: []byte("x-" + strconv.Itoa(i)), Body: []byte("1")}
		if err := st.CommitBatch(context.Background(), []*persist.Row{req}); err != nil || req.Err != nil {
			t.Fatal(err, req.Err)
		}
		frames[int(req.Seq)] = proto.AppendMsgFrame(nil, room, req.Seq, req.ID, req.From, req.TS, req.Body)
	}
	return frames
}

// TestGapHeldThenReadFromStore: a message ahead of a missing seq is held;
// after GapWindow the gap is read from the store and the stream goes out
// in order, a late duplicate dropped.
func TestGapHeldThenReadFromStore(t *testing.T) {
	st := persist.NewMemory(100)
	n, tb, l := testNode(t, st)
	key := proto.RoomKey("app", "g")
	m := member(&testOwner{})
	if err := tb.Join(m, []byte(key), Resume{}); err != nil {
		t.Fatal(err)
	}
	l.pump(t, tb, func() bool { return m.Rooms() == 1 })
	frames := commit(t, st, key, 3) // stored, but the broker lost 1 and 2
	n.OnMessage(key, 3, frames[3])
	l.runPosted(tb)
	if len(seqs(m)) != 0 || !tb.NeedsTick() {
		t.Fatalf("message ahead of a gap went out (%v) or no tick asked for", seqs(m))
	}
	l.pump(t, tb, func() bool { return len(seqs(m)) == 3 })
	n.OnMessage(key, 2, frames[2]) // the broker's copy, late
	l.runPosted(tb)
	if !sameInts(seqs(m), []int{1, 2, 3}) || n.Stats.Repairs.Load() != 1 {
		t.Fatalf("delivered %v, repairs %d; want 1 2 3 after one repair", seqs(m), n.Stats.Repairs.Load())
	}
}

// TestGapTheStoreCannotFill: when the store does not have the missing
// messages either, the members cannot get a gapless stream: they are
// resynced (closed with 1013, to rejoin with since).
func TestGapTheStoreCannotFill(t *testing.T) {
	n, tb, l := testNode(t, persist.NewMemory(100))
	key := proto.RoomKey("app", "h")
	o := &testOwner{}
	m := member(o)
	if err := tb.Join(m, []byte(key), Resume{}); err != nil {
		t.Fatal(err)
	}
	l.pump(t, tb, func() bool { return m.Rooms() == 1 })
	n.OnMessage(key, 5, proto.AppendMsgFrame(nil, "h", 5, []byte("x"), "bob", 1, []byte("1")))
	l.pump(t, tb, func() bool { return o.resyncs == 1 })
	if n.Stats.GapCloses.Load() != 1 {
		t.Fatalf("gap closes %d, want 1", n.Stats.GapCloses.Load())
	}
}

// TestOnCommittedSeesNewMessagesOnce: the hook sees each new message once,
// with the frame the commit encoded, before its source hears of it; a
// duplicate publish reaches the source and not the hook.
func TestOnCommittedSeesNewMessagesOnce(t *testing.T) {
	type seen struct {
		key   string
		seq   uint64
		ts    int64
		frame []byte
	}
	var mu sync.Mutex
	var hooked []seen
	src := &acks{got: map[string]uint64{}}
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 1, GapWindow: 10 * time.Millisecond},
		Parts{Store: persist.NewMemory(100), Pool: PoolConfig{Window: -1},
			OnCommitted: func(key string, seq uint64, ts int64, frame []byte) {
				src.mu.Lock()
				acked := len(src.got)
				src.mu.Unlock()
				mu.Lock()
				defer mu.Unlock()
				if acked > len(hooked) {
					t.Errorf("message %d reached the hook after its ack", seq)
				}
				hooked = append(hooked, seen{key, seq, ts, frame})
			}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	key := proto.RoomKey("app", "hooked")
	for _, id := range []string{"a", "b", "a"} {
		req := GetPubRequest()
		req.Key, req.From, req.Origin = key, "alice", src
		req.ID = append(req.ID, id...)
		req.Body = append(req.Body, `{"x":1}`...)
		if err := n.Publish(req); err != nil {
			t.Fatal(err)
		}
	}
	n.ClosePublishes() // commits and answers what is queued
	if src.n() != 2 || src.got["a"] != 1 || src.got["b"] != 2 {
		t.Fatalf("acked %v, want a at 1 (twice) and b at 2", src.got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != 2 || hooked[0].seq != 1 || hooked[1].seq != 2 {
		t.Fatalf("hook saw %+v, want seqs 1 and 2 once each", hooked)
	}
	for _, h := range hooked {
		ts, ok := proto.FrameTS(h.frame)
		if h.key != key || !ok || ts != h.ts || !bytes.Contains(h.frame, []byte(`"body":{"x":1}`)) {
			t.Fatalf("hook got key %q ts %d, frame %q", h.key, h.ts, h.frame)
		}
	}
}

// failingRange is a memory store whose catch-up reads fail, as a
// PostgreSQL store's do when its pool is exhausted in a reconnect storm.
type failingRange struct{ *persist.Memory }

func (failingRange) Range(context.Context, string, uint64, uint64, persist.Bounds) ([]proto.Message, bool, error) {
	return nil, false, errors.New("store unavailable")
}

// TestCatchupAbandonedIsCounted: a join with since whose catch-up read
// fails closes the member with 1013 (Resync) and counts it as an
// abandoned catch-up, not as a slow consumer.
func TestCatchupAbandonedIsCounted(t *testing.T) {
	store := failingRange{persist.NewMemory(100)}
	n, tb, l := testNode(t, store)
	key := proto.RoomKey("app", "storm")
	for i := 0; i < 5; i++ {
		row := persist.Row{Key: key, From: "bob", ID: []byte(strconv.Itoa(i)), Body: []byte(`"x"`)}
		if err := store.CommitBatch(context.Background(), []*persist.Row{&row}); err != nil || row.Stored.Err != nil {
			t.Fatalf("commit: %v %v", err, row.Stored.Err)
		}
	}
	o := &testOwner{}
	m := member(o)
	if err := tb.Join(m, []byte(key), Resume{Since: 1, HasSince: true}); err != nil {
		t.Fatal(err)
	}
	l.pump(t, tb, func() bool { return o.resyncs == 1 })
	if got := n.Stats.CatchupsAbandoned.Load(); got != 1 {
		t.Fatalf("abandoned catch-ups %d, want 1", got)
	}
	if got := n.Stats.SlowCloses.Load(); got != 0 {
		t.Fatalf("slow-consumer closes %d, want 0", got)
	}
}

// blockedRange is a memory store whose catch-up reads wait for release:
// readers busy, as in a reconnect storm.
type blockedRange struct {
	*persist.Memory
	release chan struct{}
}

func (b blockedRange) Range(ctx context.Context, key string, after, upto uint64, bd persist.Bounds) ([]proto.Message, bool, error) {
	<-b.release
	return b.Memory.Range(ctx, key, after, upto, bd)
}

// TestCatchupWaitsForTheReaders: a join with since whose catch-up finds
// the read queue full waits for a tick and is caught up once the readers
// have room; it is not closed with 1013.
func TestCatchupWaitsForTheReaders(t *testing.T) {
	store := blockedRange{persist.NewMemory(100), make(chan struct{})}
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 1, ReadQueue: 1, GapWindow: 10 * time.Millisecond},
		Parts{Store: store, Pool: PoolConfig{Window: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	var released sync.Once
	release := func() { released.Do(func() { close(store.release) }) }
	t.Cleanup(release) // before Close: a reader still waits in Range on a failure
	l := &testLoop{}
	tb := n.NewTable(0, l)
	key := proto.RoomKey("app", "storm")
	for i := 1; i <= 5; i++ {
		row := persist.Row{Key: key, From: "bob", ID: []byte(strconv.Itoa(i)), Body: []byte(`"x"`)}
		if err := store.CommitBatch(context.Background(), []*persist.Row{&row}); err != nil || row.Stored.Err != nil {
			t.Fatalf("commit: %v %v", err, row.Stored.Err)
		}
	}
	owners := make([]*testOwner, 4)
	ms := make([]*Member, 4)
	for i := range ms {
		owners[i] = &testOwner{}
		ms[i] = member(owners[i])
		if err := tb.Join(ms[i], []byte(key), Resume{Since: 1, HasSince: true}); err != nil {
			t.Fatal(err)
		}
	}
	// The room's head first (one read), then one catch-up per member: the
	// reader holds one, the queue one, the others wait on the loop.
	deadline := time.Now().Add(5 * time.Second)
	for n.Stats.CatchupsDeferred.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no catch-up waited for the readers")
		}
		l.runPosted(tb)
		tb.PumpPaced()
		time.Sleep(time.Millisecond)
	}
	release()
	l.pump(t, tb, func() bool {
		tb.PumpPaced()
		for _, m := range ms {
			// a catch-up page is one buffer of frames: seqs 2 to 5
			if all := bytes.Join(m.Out.Pending(), nil); bytes.Count(all, []byte(`"op":"msg"`)) != 4 || !bytes.Contains(all, []byte(`"seq":5,`)) {
				return false
			}
		}
		return true
	})
	for i, o := range owners {
		if o.resyncs != 0 {
			t.Fatalf("member %d closed with 1013 %d times", i, o.resyncs)
		}
	}
	if got := n.Stats.CatchupsAbandoned.Load(); got != 0 {
		t.Fatalf("abandoned catch-ups %d, want 0", got)
	}
}
