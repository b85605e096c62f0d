package persist

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

func TestMemoryContract(t *testing.T) {
	testStoreContract(t, func(t *testing.T) Store { return NewMemory(0) })
}

func TestMemoryKeepWindow(t *testing.T) {
	ctx := context.Background()
	st := NewMemory(3)
	k := proto.RoomKey("app1", "r")
	fill(t, st, k, 5) // keeps m3..m5
	msgs, _, err := st.Range(ctx, k, 0, 10, Bounds{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "Range", msgs, 3, 5)
	msgs, _, _ = st.History(ctx, k, 0, Bounds{Limit: 10})
	wantSeqs(t, "History", msgs, 3, 5)
	msgs, _, _ = st.History(ctx, k, 4, Bounds{Limit: 10})
	wantSeqs(t, "History(4)", msgs, 3, 3)

	res := commit(t, st, req(k, "u", "m4", `dup`), req(k, "u", "m1", `again`))
	if !res[0].Duplicate || res[0].Seq != 4 {
		t.Fatalf("kept key: %+v, want duplicate of 4", res[0])
	}
	// m1 left the window with its message, so it is stored anew.
	if res[1].Duplicate || res[1].Seq != 6 {
		t.Fatalf("evicted key: %+v, want new seq 6", res[1])
	}
	// m3 was evicted by seq 6: its key goes with it.
	if res := commit(t, st, req(k, "u", "m3", `x`)); res[0].Duplicate || res[0].Seq != 7 {
		t.Fatalf("evicted m3: %+v", res[0])
	}
	if last, _ := st.LastSeq(ctx, k); last != 7 {
		t.Fatalf("LastSeq = %d", last)
	}
	for i := 0; i < 100; i++ {
		commit(t, st, req(k, "u", fmt.Sprint("n", i), `1`))
	}
	for i := range st.shards {
		sh := &st.shards[i]
		for _, r := range sh.rooms {
			if len(r.idem) != 3 || len(r.ring) != 3 {
				t.Fatalf("room holds %d keys, %d entries; want 3", len(r.idem), len(r.ring))
			}
		}
	}
}

// TestMemoryRetention: per-app count and age limits on top of keep, and
// the counters of what they removed.
func TestMemoryRetention(t *testing.T) {
	ctx := context.Background()
	st := NewMemory(10)
	st.SetRetentionPolicy(RetentionPolicy{
		Default: Retention{MaxAge: time.Hour},
		Apps:    map[string]Retention{"small": {MaxCount: 3}, "forever": {}},
	})
	small, def, forever := proto.RoomKey("small", "r"), proto.RoomKey("def", "r"), proto.RoomKey("forever", "r")
	fill(t, st, small, 5)
	fill(t, st, def, 12)
	fill(t, st, forever, 4)
	msgs, _, _ := st.Range(ctx, small, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "small", msgs, 3, 5)
	msgs, _, _ = st.Range(ctx, def, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "def (keep 10)", msgs, 3, 12)
	if rs := st.RetentionStats(); rs.DeletedByCount != 2+2 || rs.DeletedByAge != 0 {
		t.Fatalf("stats after count eviction: %+v", rs)
	}
	// Two hours later the default app's messages are gone, the others stay.
	if n := st.EnforceRetention(time.Now().Add(2 * time.Hour)); n != 10 {
		t.Fatalf("EnforceRetention removed %d, want 10", n)
	}
	if msgs, _, _ = st.History(ctx, def, 0, Bounds{Limit: 100}); len(msgs) != 0 {
		t.Fatalf("aged room still has %d messages", len(msgs))
	}
	msgs, _, _ = st.Range(ctx, forever, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "forever", msgs, 1, 4)
	if rs := st.RetentionStats(); rs.DeletedByAge != 10 || rs.Runs != 1 {
		t.Fatalf("stats after age: %+v", rs)
	}
	// The sequence goes on after everything was removed, and the ring
	// still indexes correctly.
	res := commit(t, st, req(def, "u", "after", `1`), req(def, "u", "after2", `2`))
	if res[0].Seq != 13 || res[1].Seq != 14 {
		t.Fatalf("after age: %+v", res)
	}
	msgs, _, _ = st.Range(ctx, def, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "def after", msgs, 13, 14)
	if h, _ := st.Head(ctx, def); h.Last != 14 {
		t.Fatalf("Head = %+v", h)
	}
	st.StartRetention(ctx, 10*time.Millisecond)
	st.Close()
}

// TestMemoryEpochPerStore: a new store (a restarted process) gives the
// same room another epoch.
func TestMemoryEpochPerStore(t *testing.T) {
	ctx := context.Background()
	k := proto.RoomKey("app1", "r")
	a, _ := NewMemory(0).Head(ctx, k)
	b, _ := NewMemory(0).Head(ctx, k)
	if a.Epoch == b.Epoch || a.Epoch == "" || len(a.Epoch) > MaxEpoch {
		t.Fatalf("epochs %q and %q", a.Epoch, b.Epoch)
	}
}

// TestMemoryAppRetention: the registry's retention (an --apps file's
// keep_count and keep_age) reaches rooms that exist and rooms made later,
// below --app-retention and above the default; a lower count trims at
// once and the ring goes on indexing, in order, as it shrinks and grows;
// an age starts the aging job that no flag had started.
func TestMemoryAppRetention(t *testing.T) {
	ctx := context.Background()
	st := NewMemory(10)
	defer st.Close()
	st.SetRetentionPolicy(RetentionPolicy{Apps: map[string]Retention{"pinned": {MaxCount: 8}}})
	st.StartRetention(ctx, 20*time.Millisecond) // no age anywhere yet: nothing runs
	a, pinned, other := proto.RoomKey("a", "r"), proto.RoomKey("pinned", "r"), proto.RoomKey("other", "r")
	fill(t, st, a, 10)
	fill(t, st, pinned, 10)
	fill(t, st, other, 10)
	if rs := st.RetentionStats(); rs.DeletedByCount != 2 { // pinned's 8 of 10
		t.Fatalf("before: %+v", rs)
	}

	st.SetAppRetention(map[string]Retention{"a": {MaxCount: 3}, "pinned": {MaxCount: 2}})
	msgs, _, _ := st.Range(ctx, a, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "a trimmed to 3", msgs, 8, 10)
	msgs, _, _ = st.Range(ctx, pinned, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "pinned (--app-retention wins)", msgs, 3, 10)
	msgs, _, _ = st.Range(ctx, other, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "other (default)", msgs, 1, 10)
	if rs := st.RetentionStats(); rs.DeletedByCount != 2+7 {
		t.Fatalf("after the trim: %+v", rs)
	}
	for i := 0; i < 5; i++ { // the shrunk ring wraps
		commit(t, st, req(a, "u", fmt.Sprint("x", i), `1`))
	}
	msgs, _, _ = st.Range(ctx, a, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "a after 5 more", msgs, 13, 15)
	if res := commit(t, st, req(a, "u", "x4", `dup`)); !res[0].Duplicate || res[0].Seq != 15 {
		t.Fatalf("a kept key after the trim: %+v", res[0])
	}
	if msgs, _, _ = st.History(ctx, a, 15, Bounds{Limit: 2}); len(msgs) != 2 || msgs[0].Seq != 13 || msgs[1].Seq != 14 {
		t.Fatalf("History after the trim: %+v", msgs)
	}

	// The same map again changes nothing; a higher count lets the room grow.
	st.SetAppRetention(map[string]Retention{"a": {MaxCount: 3}, "pinned": {MaxCount: 2}})
	st.SetAppRetention(map[string]Retention{"a": {MaxCount: 6}})
	fill2 := func(key string, from, n int) {
		for i := from; i < from+n; i++ {
			commit(t, st, req(key, "u", fmt.Sprint("y", i), `1`))
		}
	}
	fill2(a, 0, 4)
	msgs, _, _ = st.Range(ctx, a, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "a grown to 6", msgs, 14, 19)
	b := proto.RoomKey("a", "new")
	fill2(b, 0, 9)
	msgs, _, _ = st.Range(ctx, b, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "a room made later", msgs, 4, 9)

	// Dropped from the registry: back to --keep.
	st.SetAppRetention(nil)
	fill2(a, 10, 6)
	msgs, _, _ = st.Range(ctx, a, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "a back to keep 10", msgs, 16, 25)

	// An age from the registry starts the aging job.
	st.SetAppRetention(map[string]Retention{"a": {MaxAge: time.Millisecond}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		msgs, _, _ = st.Range(ctx, a, 0, 100, Bounds{Limit: 100})
		if len(msgs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's messages older than 1ms still kept: %d", len(msgs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	msgs, _, _ = st.Range(ctx, other, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "other untouched by a's age", msgs, 1, 10)
}
