package persist

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/roost-chat/roost/proto"
)

// storeFactory returns a fresh, empty store; the factory registers its
// cleanup with t.
type storeFactory func(t *testing.T) Store

// testStoreContract runs the Store contract over one implementation.
func testStoreContract(t *testing.T, newStore storeFactory) {
	t.Run("SeqFromOne", func(t *testing.T) { testSeqFromOne(t, newStore(t)) })
	t.Run("Duplicates", func(t *testing.T) { testDuplicates(t, newStore(t)) })
	t.Run("InBatchDuplicates", func(t *testing.T) { testInBatchDuplicates(t, newStore(t)) })
	t.Run("RangeBounds", func(t *testing.T) { testRangeBounds(t, newStore(t)) })
	t.Run("HistoryBounds", func(t *testing.T) { testHistoryBounds(t, newStore(t)) })
	t.Run("UnknownRoom", func(t *testing.T) { testUnknownRoom(t, newStore(t)) })
	t.Run("Head", func(t *testing.T) { testHead(t, newStore(t)) })
	t.Run("LastSeqs", func(t *testing.T) { testLastSeqs(t, newStore(t)) })
	t.Run("ByteBounds", func(t *testing.T) { testByteBounds(t, newStore(t)) })
}

func req(key, from, id, body string) *Row {
	return &Row{Key: key, From: from, ID: []byte(id), Body: []byte(body)}
}

// commitInto commits reqs and copies their answers into res, as the
// tests compare them.
func commitInto(ctx context.Context, st Store, reqs []*Row, res []Stored) error {
	err := st.CommitBatch(ctx, reqs)
	for i, r := range reqs {
		res[i] = r.Stored
	}
	return err
}

// stored returns the answers of rows.
func stored(rows []*Row) []Stored {
	res := make([]Stored, len(rows))
	for i, r := range rows {
		res[i] = r.Stored
	}
	return res
}

func commit(t *testing.T, st Store, reqs ...*Row) []Stored {
	t.Helper()
	res := make([]Stored, len(reqs))
	if err := commitInto(context.Background(), st, reqs, res); err != nil {
		t.Fatalf("CommitBatch: %v", err)
	}
	for i := range res {
		if res[i].Err != nil {
			t.Fatalf("res[%d].Err = %v after a successful CommitBatch", i, res[i].Err)
		}
		if res[i].Seq == 0 || res[i].TS == 0 {
			t.Fatalf("res[%d] = %+v: zero seq or ts", i, res[i])
		}
	}
	return res
}

// fill stores n messages m1..mn in key, in batches of 7.
func fill(t *testing.T, st Store, key string, n int) {
	t.Helper()
	var batch []*Row
	for i := 1; i <= n; i++ {
		batch = append(batch, req(key, "u", fmt.Sprintf("m%d", i), fmt.Sprintf(`{"n":%d}`, i)))
		if len(batch) == 7 || i == n {
			commit(t, st, batch...)
			batch = nil
		}
	}
}

func wantSeqs(t *testing.T, what string, msgs []proto.Message, lo, hi uint64) {
	t.Helper()
	var got []uint64
	for _, m := range msgs {
		got = append(got, m.Seq)
	}
	var want []uint64
	for s := lo; s <= hi && lo != 0; s++ {
		want = append(want, s)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: seqs %v, want %v", what, got, want)
	}
}

func testSeqFromOne(t *testing.T, st Store) {
	ctx := context.Background()
	a, b := proto.RoomKey("app1", "a"), proto.RoomKey("app1", "b")
	var reqs []*Row
	for i := 0; i < 10; i++ {
		reqs = append(reqs, req(a, "alice", fmt.Sprintf("a%d", i), fmt.Sprintf(`{"i":%d}`, i)))
		reqs = append(reqs, req(b, "bob", fmt.Sprintf("b%d", i), fmt.Sprintf(`"\u00e9 %d"`, i)))
	}
	res := commit(t, st, reqs[:5]...)
	res = append(res, commit(t, st, reqs[5:]...)...)
	na, nb := uint64(0), uint64(0)
	for i, r := range res {
		if r.Duplicate {
			t.Fatalf("res[%d] duplicate", i)
		}
		want := &na
		if reqs[i].Key == b {
			want = &nb
		}
		*want++
		if r.Seq != *want {
			t.Fatalf("res[%d].Seq = %d, want %d", i, r.Seq, *want)
		}
	}
	for key, n := range map[string]uint64{a: 10, b: 10} {
		last, err := st.LastSeq(ctx, key)
		if err != nil || last != n {
			t.Fatalf("LastSeq(%s) = %d, %v; want %d", key, last, err, n)
		}
	}
	msgs, _, err := st.Range(ctx, b, 0, 100, Bounds{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "Range b", msgs, 1, 10)
	for i, m := range msgs {
		if m.Room != "b" || m.From != "bob" || m.ID != fmt.Sprintf("b%d", i) ||
			!bytes.Equal(m.Body, []byte(fmt.Sprintf(`"\u00e9 %d"`, i))) || m.TS == 0 {
			t.Fatalf("Range b [%d] = %+v", i, m)
		}
	}
}

func testDuplicates(t *testing.T, st Store) {
	k := proto.RoomKey("app1", "r")
	first := commit(t, st, req(k, "alice", "x", `1`), req(k, "alice", "y", `2`))
	again := commit(t, st, req(k, "alice", "y", `changed`), req(k, "bob", "y", `3`),
		req(proto.RoomKey("app1", "other"), "alice", "y", `4`), req(proto.RoomKey("app2", "r"), "alice", "y", `5`))
	if !again[0].Duplicate || again[0].Seq != first[1].Seq || again[0].TS != first[1].TS {
		t.Fatalf("re-publish: %+v, want duplicate of %+v", again[0], first[1])
	}
	for i, want := range []uint64{3, 1, 1} {
		if r := again[i+1]; r.Duplicate || r.Seq != want {
			t.Fatalf("again[%d] = %+v, want new seq %d", i+1, r, want)
		}
	}
	msgs, _, err := st.Range(context.Background(), k, 0, 10, Bounds{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "Range", msgs, 1, 3)
	if string(msgs[1].Body) != `2` {
		t.Fatalf("duplicate overwrote the body: %q", msgs[1].Body)
	}
}

func testInBatchDuplicates(t *testing.T, st Store) {
	k, k2 := proto.RoomKey("app1", "r"), proto.RoomKey("app1", "s")
	commit(t, st, req(k, "u", "old", `0`))
	res := commit(t, st,
		req(k, "u", "a", `1`), req(k2, "u", "a", `x`), req(k, "u", "b", `2`), req(k, "u", "a", `1b`),
		req(k, "u", "old", `0b`), req(k, "u", "c", `3`), req(k2, "u", "a", `y`))
	want := []struct {
		seq uint64
		dup bool
	}{{2, false}, {1, false}, {3, false}, {2, true}, {1, true}, {4, false}, {1, true}}
	for i, w := range want {
		if res[i].Seq != w.seq || res[i].Duplicate != w.dup {
			t.Fatalf("res[%d] = %+v, want seq %d dup %v", i, res[i], w.seq, w.dup)
		}
	}
	if res[3].TS != res[0].TS {
		t.Fatalf("in-batch duplicate ts %d, want %d", res[3].TS, res[0].TS)
	}
	if last, _ := st.LastSeq(context.Background(), k); last != 4 {
		t.Fatalf("LastSeq = %d, want 4", last)
	}
}

func testRangeBounds(t *testing.T, st Store) {
	ctx := context.Background()
	k := proto.RoomKey("app1", "r")
	fill(t, st, k, 20)
	for _, c := range []struct {
		after, upto uint64
		limit       int
		lo, hi      uint64
	}{
		{0, 20, 100, 1, 20},
		{5, 20, 100, 6, 20},
		{5, 10, 100, 6, 10},
		{5, 10, 3, 6, 8},
		{0, 100, 5, 1, 5},
		{19, 20, 5, 20, 20},
		{20, 30, 5, 0, 0},
		{10, 10, 5, 0, 0},
		{10, 5, 5, 0, 0},
		{0, 20, 0, 0, 0},
	} {
		msgs, _, err := st.Range(ctx, k, c.after, c.upto, Bounds{Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		wantSeqs(t, fmt.Sprintf("Range(%d,%d,%d)", c.after, c.upto, c.limit), msgs, c.lo, c.hi)
	}
}

func testHistoryBounds(t *testing.T, st Store) {
	ctx := context.Background()
	k := proto.RoomKey("app1", "r")
	fill(t, st, k, 20)
	for _, c := range []struct {
		before uint64
		limit  int
		lo, hi uint64
	}{
		{0, 100, 1, 20},
		{0, 5, 16, 20},
		{10, 5, 5, 9},
		{10, 100, 1, 9},
		{2, 5, 1, 1},
		{1, 5, 0, 0},
		{100, 3, 18, 20},
		{0, 0, 0, 0},
	} {
		msgs, _, err := st.History(ctx, k, c.before, Bounds{Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		wantSeqs(t, fmt.Sprintf("History(%d,%d)", c.before, c.limit), msgs, c.lo, c.hi)
	}
}

func testUnknownRoom(t *testing.T, st Store) {
	ctx := context.Background()
	k := proto.RoomKey("app1", "nobody")
	if last, err := st.LastSeq(ctx, k); err != nil || last != 0 {
		t.Fatalf("LastSeq = %d, %v", last, err)
	}
	if msgs, _, err := st.Range(ctx, k, 0, 10, Bounds{Limit: 10}); err != nil || len(msgs) != 0 {
		t.Fatalf("Range = %v, %v", msgs, err)
	}
	if msgs, _, err := st.History(ctx, k, 0, Bounds{Limit: 10}); err != nil || len(msgs) != 0 {
		t.Fatalf("History = %v, %v", msgs, err)
	}
}

// testLastSeqs: every room's newest seq in one call, a room not stored 0,
// a key twice answered twice.
func testLastSeqs(t *testing.T, st Store) {
	ctx := context.Background()
	a, b, none := proto.RoomKey("app1", "a"), proto.RoomKey("app1", "b"), proto.RoomKey("app1", "none")
	fill(t, st, a, 3)
	fill(t, st, b, 5)
	keys := []string{b, none, a, b}
	last := []uint64{9, 9, 9, 9}
	if err := st.LastSeqs(ctx, keys, last); err != nil || !slices.Equal(last, []uint64{5, 0, 3, 5}) {
		t.Fatalf("LastSeqs(%q) = %v, %v; want [5 0 3 5]", keys, last, err)
	}
	if err := st.LastSeqs(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// testHead: a room has its epoch before its first message, keeps it while
// messages are stored, and rooms do not share one.
func testHead(t *testing.T, st Store) {
	ctx := context.Background()
	k, other := proto.RoomKey("app1", "r"), proto.RoomKey("app1", "other")
	h0, err := st.Head(ctx, k)
	if err != nil || h0.Last != 0 || h0.Epoch == "" || len(h0.Epoch) > MaxEpoch {
		t.Fatalf("Head of a new room = %+v, %v", h0, err)
	}
	fill(t, st, k, 3)
	h1, err := st.Head(ctx, k)
	if err != nil || h1.Last != 3 || h1.Epoch != h0.Epoch {
		t.Fatalf("Head after 3 messages = %+v, %v; want last 3, epoch %q", h1, err, h0.Epoch)
	}
	if last, err := st.LastSeq(ctx, k); err != nil || last != 3 {
		t.Fatalf("LastSeq = %d, %v", last, err)
	}
	fill(t, st, other, 1)
	if h2, err := st.Head(ctx, other); err != nil || h2.Last != 1 || h2.Epoch == h0.Epoch {
		t.Fatalf("Head of another room = %+v, %v; its epoch must be its own", h2, err)
	}
}

// testByteBounds: a read stops at the byte bound (but always returns its
// first message) and at the limit, and says so.
func testByteBounds(t *testing.T, st Store) {
	ctx := context.Background()
	k := proto.RoomKey("app1", "big")
	body := func(n int) string { return `"` + strings.Repeat("x", n) + `"` }
	var reqs []*Row
	for i := 1; i <= 10; i++ {
		reqs = append(reqs, req(k, "u", fmt.Sprintf("m%02d", i), body(1000)))
	}
	commit(t, st, reqs...)
	one := MsgSize(&proto.Message{Room: "big", ID: "m10", From: "u", Body: []byte(body(1000))})
	for _, c := range []struct {
		after, upto uint64
		b           Bounds
		lo, hi      uint64
		more        bool
	}{
		{0, 10, Bounds{Limit: 100}, 1, 10, false},
		{0, 10, Bounds{Limit: 100, MaxBytes: 3 * one}, 1, 3, true},
		{0, 10, Bounds{Limit: 100, MaxBytes: 3*one - 1}, 1, 2, true},
		{0, 10, Bounds{Limit: 100, MaxBytes: 1}, 1, 1, true}, // the first always comes
		{0, 10, Bounds{Limit: 4}, 1, 4, true},
		{0, 4, Bounds{Limit: 4}, 1, 4, false},
		{7, 10, Bounds{Limit: 100, MaxBytes: 3 * one}, 8, 10, false},
		{0, 10, Bounds{Limit: 100, MaxBytes: 100 * one}, 1, 10, false},
	} {
		msgs, more, err := st.Range(ctx, k, c.after, c.upto, c.b)
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("Range(%d,%d,%+v)", c.after, c.upto, c.b)
		wantSeqs(t, what, msgs, c.lo, c.hi)
		if more != c.more {
			t.Fatalf("%s: more %v, want %v", what, more, c.more)
		}
	}
	for _, c := range []struct {
		before uint64
		b      Bounds
		lo, hi uint64
		more   bool
	}{
		{0, Bounds{Limit: 100}, 1, 10, false},
		{0, Bounds{Limit: 100, MaxBytes: 3 * one}, 8, 10, true},
		{0, Bounds{Limit: 100, MaxBytes: 1}, 10, 10, true},
		{5, Bounds{Limit: 100, MaxBytes: 2 * one}, 3, 4, true},
		{4, Bounds{Limit: 100, MaxBytes: 3 * one}, 1, 3, false},
		{0, Bounds{Limit: 2}, 9, 10, true},
	} {
		msgs, more, err := st.History(ctx, k, c.before, c.b)
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("History(%d,%+v)", c.before, c.b)
		wantSeqs(t, what, msgs, c.lo, c.hi)
		if more != c.more {
			t.Fatalf("%s: more %v, want %v", what, more, c.more)
		}
		for _, m := range msgs {
			if string(m.Body) != body(1000) || m.ID == "" {
				t.Fatalf("%s: message %+v", what, m)
			}
		}
	}
}
