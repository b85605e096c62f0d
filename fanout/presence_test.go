package fanout

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/pubsub"
)

// The tracker turns connections into per-user changes: a second
// connection of a user is no change, a leave waits out the grace, a
// return within it is no change at all.
func TestPresenceTracker(t *testing.T) {
	n, _, _ := testNode(t, persist.NewMemory(10))
	pr := newPresence(n, pubsub.NewMemoryPresence(), time.Second)
	now := int64(1_000_000)
	tick := func() []pubsub.PresenceChange {
		pr.collect(now)
		c := append([]pubsub.PresenceChange(nil), pr.changes...)
		pr.changes = pr.changes[:0]
		return c
	}
	pr.join("a/r", "alice", true)
	pr.join("a/r", "alice", false)
	if c := tick(); len(c) != 2 || c[0].Op != pubsub.PresenceWatch || c[1].Op != pubsub.PresenceJoin || c[1].User != "alice" {
		t.Fatalf("first tick %+v", c)
	}
	pr.leave("a/r", "alice", false, now)
	if c := tick(); len(c) != 0 {
		t.Fatalf("one of two connections left: %+v", c)
	}
	pr.leave("a/r", "alice", true, now)
	now += 500
	if c := tick(); len(c) != 1 || c[0].Op != pubsub.PresenceUnwatch {
		t.Fatalf("in the grace: %+v", c)
	}
	pr.join("a/r", "alice", false) // back within the grace
	now += 1000
	if c := tick(); len(c) != 0 {
		t.Fatalf("a reload: %+v", c)
	}
	pr.leave("a/r", "alice", false, now)
	now += 999
	if c := tick(); len(c) != 0 {
		t.Fatalf("before the grace ended: %+v", c)
	}
	now++
	if c := tick(); len(c) != 1 || c[0].Op != pubsub.PresenceLeave {
		t.Fatalf("after the grace: %+v", c)
	}
	if len(pr.shard("a/r").rooms) != 0 {
		t.Fatal("the room's entry outlived its users")
	}
}

// BenchmarkPresenceMove: the node-side cost of one user moving between
// rooms in process: the two counts on the loop, and its share of a tick
// (collect, Apply on the in-process Presence, the diff encoded for the
// broker and received back), 1,000 moves per tick, one of the 100 rooms
// watched, grace 0.
func BenchmarkPresenceMove(b *testing.B) {
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 1, GapWindow: time.Second},
		Parts{Store: persist.NewMemory(10), Pool: PoolConfig{Window: -1}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Close() })
	n.NewTable(0, &testLoop{})
	pr := newPresence(n, pubsub.NewMemoryPresence(), time.Nanosecond)
	const users, rooms = 15000, 100
	names := make([]string, users)
	keys := make([]string, rooms)
	for i := range names {
		names[i] = "user-" + strconv.Itoa(i)
	}
	for i := range keys {
		keys[i] = "app/room-" + strconv.Itoa(i)
	}
	at := make([]int, users)
	for u := range names {
		at[u] = u % rooms
		pr.join(keys[at[u]], names[u], false)
	}
	pr.join(keys[0], "watcher", true)
	now := time.Now().UnixMilli()
	pr.tick(now)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		u := i % users
		pr.leave(keys[at[u]], names[u], false, now)
		at[u] = (at[u] + 1 + i%(rooms-1)) % rooms
		pr.join(keys[at[u]], names[u], false)
		if i%1000 == 999 {
			now += 2
			pr.tick(now)
		}
	}
}

// An idle node's presence goroutine sleeps: it wakes for a change, the
// grace period of a leave and the diffs they make, and not at all once
// they are through (in process there is no lease to renew). Counted
// through its wake-up counter: the old 200 ms ticker woke 5 times in each
// quiet second below.
func TestPresenceIdleNodeSleeps(t *testing.T) {
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 1, GapWindow: time.Second},
		Parts{Store: persist.NewMemory(10), Pool: PoolConfig{Window: -1}, PresenceGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	n.NewTable(0, &testLoop{})
	wakes := func() uint64 { return n.Stats.PresenceWakes.Load() }
	quiet := func(what string) {
		t.Helper()
		// What a poke or a deadline already asked for comes within a
		// tick; after that nothing waits. Settled once two ticks pass
		// with no wake-up (on a loaded machine a wake still due may come
		// late: a fixed pause would count it in the quiet second).
		w := wakes()
		for since, end := time.Now(), time.Now().Add(5*time.Second); time.Since(since) < 2*presenceTick; time.Sleep(10 * time.Millisecond) {
			if now := wakes(); now != w {
				w, since = now, time.Now()
			}
			if time.Now().After(end) {
				t.Fatalf("%s: the presence goroutine does not settle", what)
			}
		}
		time.Sleep(time.Second)
		if got := wakes() - w; got != 0 {
			t.Fatalf("%s: the presence goroutine woke %d times in a quiet second", what, got)
		}
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not reached", what)
			}
		}
	}
	count := func() int {
		c, err := n.PresenceCount(context.Background(), "a/r")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	quiet("a node that never had presence")
	if w := wakes(); w != 0 {
		t.Fatalf("woke %d times before any presence", w)
	}

	n.pres.join("a/r", "watcher", true)
	n.pres.join("a/r", "alice", false)
	until("two users present, the diff sent", func() bool { return count() == 2 && n.Stats.PresenceFrames.Load() == 1 })
	quiet("two idle users")

	n.pres.leave("a/r", "alice", false, n.tables[0].Load().loop.Now())
	until("alice left after her grace", func() bool { return count() == 1 && n.Stats.PresenceFrames.Load() == 2 })
	quiet("after a leave")

	// A presence answer is kept for a tick, then forgotten.
	if _, err := n.pres.answer(context.Background(), "a/r"); err != nil {
		t.Fatal(err)
	}
	until("the answer forgotten", func() bool {
		n.pres.amu.Lock()
		defer n.pres.amu.Unlock()
		return len(n.pres.answers) == 0
	})
	quiet("after a presence query")
	t.Logf("%d wake-ups in all", wakes())
}

// A diff received while the presence goroutine flushes is sent, never
// lost: the broker's goroutine delivers a node's own diffs the moment its
// Publish returns, which is when that node's tick flushes. A flush that
// forgot the room's empty pending entry between the message's room line
// and its user lines left the users on an entry no flush would see: the
// room's subscribers never heard of them.
func TestPresenceReceivedDuringFlush(t *testing.T) {
	n, _, _ := testNode(t, persist.NewMemory(10))
	pr := newPresence(n, pubsub.NewMemoryPresence(), time.Second)
	// Long user lines make the gap between a room line and its user line
	// (the line is scanned there) long enough for a flush to fall in it
	// on every run.
	const rooms = 64
	user := strings.Repeat("u", 16<<10)
	var msg []byte
	for r := range rooms {
		key := "a/r" + strconv.Itoa(r)
		pr.join(key, "watcher", true)
		msg = append(msg, "K"+key+"\n+"+user+"\n"...)
	}
	// The presence goroutine, flushing without a pause; every flush a
	// second after the one before, so that each either sends a room's
	// pending users or forgets its empty entry.
	var passes atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for now := int64(1_000_000); ; now += presenceEvery.Milliseconds() {
			select {
			case <-stop:
				return
			default:
			}
			pr.flush(now)
			passes.Add(1)
		}
	}()
	defer func() { close(stop); <-done }()
	end := time.Now().Add(3 * time.Second)
	i := 1
	for ; time.Now().Before(end); i++ {
		pr.received(msg)
		// Two passes begun after it: every user of the message is sent.
		for p := passes.Load(); passes.Load() < p+2; {
			runtime.Gosched()
		}
		if got, want := n.Stats.PresenceFrames.Load(), uint64(i*rooms); got != want {
			t.Fatalf("message %d: %d presence_diff frames made, want %d: a received user was lost", i, got, want)
		}
	}
	t.Logf("%d messages, %d flushes", i-1, passes.Load())
}

// An idle joined user costs its room's map slot only: the end of a user's
// last membership is kept (zero) only while it waits out its grace, and a
// burst's dirty list is given back once collected (density2).
func TestPresenceIdleUserLazy(t *testing.T) {
	n, _, _ := testNode(t, persist.NewMemory(10))
	pr := newPresence(n, pubsub.NewMemoryPresence(), time.Second)
	now := int64(1_000_000)
	const users = 500
	for i := range users {
		pr.join("a/r", "u"+strconv.Itoa(i), false)
	}
	pr.collect(now)
	s := pr.shard("a/r")
	r := s.rooms["a/r"]
	if r.zero != nil || s.dirty != nil {
		t.Fatalf("idle room holds zero %v, dirty cap %d", r.zero, cap(s.dirty))
	}
	if u := r.users["u7"]; u.conns != 1 || !u.reported || u.queued {
		t.Fatalf("u7 %+v", u)
	}
	pr.leave("a/r", "u7", false, now)
	pr.leave("a/r", "u8", false, now)
	if r.zero["u7"] != now || len(r.zero) != 2 {
		t.Fatalf("zero %v", r.zero)
	}
	pr.join("a/r", "u8", false) // back within the grace
	if _, ok := r.zero["u8"]; ok {
		t.Fatal("a returning user's end kept")
	}
	if next := pr.collect(now + 10); next != now+1000 {
		t.Fatalf("next %d", next)
	}
	pr.collect(now + 1000)
	if _, ok := r.users["u7"]; ok || r.zero != nil {
		t.Fatalf("after the grace: u7 kept, zero %v", r.zero)
	}
	if u := r.users["u8"]; u.conns != 1 || !u.reported || u.queued {
		t.Fatalf("u8 %+v", u)
	}
	if len(r.users) != users-1 || r.unrep != 0 {
		t.Fatalf("users %d unrep %d", len(r.users), r.unrep)
	}
}

// Without a shared Presence the node's own counts answer (localPresence):
// given the same joins, leaves and ticks, it answers and diffs as the
// in-process store fed the node's changes does (pubsub.MemoryPresence).
func TestPresenceLocalMatchesMemory(t *testing.T) {
	n, _, _ := testNode(t, persist.NewMemory(10))
	mem := newPresence(n, pubsub.NewMemoryPresence(), time.Second)
	loc := newPresence(n, nil, time.Second)
	loc.p = localPresence{loc}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	type live struct {
		key, user string
		watch     bool
	}
	var lives [2][]live // the same memberships in each
	keys := []string{"a/r0", "a/r1", "a/r2", "b/r0"}
	tickDiffs := func(pr *presence, now int64) map[string]string {
		pr.collect(now)
		diffs, err := pr.p.Apply(ctx, pr.changes)
		if err != nil {
			t.Fatal(err)
		}
		pr.changes = pr.changes[:0]
		m := map[string]string{}
		for _, d := range diffs {
			m[d.Key] = fmt.Sprint(d.Joined, d.Left, d.Watched)
		}
		return m
	}
	now := int64(1_000_000)
	diffed := 0
	for step := range 400 {
		for range rng.IntN(6) {
			if len(lives[0]) > 0 && rng.IntN(3) == 0 {
				i := rng.IntN(len(lives[0]))
				for j, pr := range []*presence{mem, loc} {
					l := lives[j][i]
					pr.leave(l.key, l.user, l.watch, now)
					lives[j] = slices.Delete(lives[j], i, i+1)
				}
				continue
			}
			l := live{keys[rng.IntN(len(keys))], "u" + strconv.Itoa(rng.IntN(8)), rng.IntN(4) == 0}
			for j, pr := range []*presence{mem, loc} {
				pr.join(l.key, l.user, l.watch)
				lives[j] = append(lives[j], l)
			}
		}
		now += int64(rng.IntN(600))
		dm, dl := tickDiffs(mem, now), tickDiffs(loc, now)
		if !maps.Equal(dm, dl) {
			t.Fatalf("step %d: diffs %v, local %v", step, dm, dl)
		}
		diffed += len(dm)
		for _, key := range keys {
			cm, um, _ := mem.p.Query(ctx, key, 100)
			cl, ul, _ := loc.p.Query(ctx, key, 100)
			slices.Sort(um)
			slices.Sort(ul)
			if cm != cl || !slices.Equal(um, ul) {
				t.Fatalf("step %d %s: %d %v, local %d %v", step, key, cm, um, cl, ul)
			}
			if c, _ := loc.p.Count(ctx, key); c != cm {
				t.Fatalf("step %d %s: count %d, want %d", step, key, c, cm)
			}
		}
		counts := make([]int, len(keys))
		if err := loc.p.Counts(ctx, keys, counts); err != nil {
			t.Fatal(err)
		}
		for i, key := range keys {
			if c, _ := mem.p.Count(ctx, key); c != counts[i] {
				t.Fatalf("step %d %s: counts %d, want %d", step, key, counts[i], c)
			}
		}
	}
	if diffed == 0 {
		t.Fatal("no diff compared")
	}
	t.Logf("%d room diffs compared", diffed)
}
