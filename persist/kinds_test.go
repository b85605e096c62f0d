package persist

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// The rules of "Messages that change" (docs/protocol.md), run over every
// store: TestMemoryKinds and TestPostgresKinds.
func testKindsContract(t *testing.T, newStore func(t *testing.T) Store) {
	t.Run("Rules", func(t *testing.T) { testKindRules(t, newStore(t)) })
	t.Run("Reactions", func(t *testing.T) { testKindReactions(t, newStore(t)) })
	t.Run("SameBatch", func(t *testing.T) { testKindSameBatch(t, newStore(t)) })
	t.Run("Resent", func(t *testing.T) { testKindResent(t, newStore(t)) })
	t.Run("FoldModel", func(t *testing.T) { testFoldModel(t, newStore(t), 10000, 0) })
	t.Run("FoldModelAfterPlain", func(t *testing.T) { testFoldModel(t, newStore(t), 3000, 700) })
	t.Run("UnreadCount", func(t *testing.T) { testUnreadCountKinds(t, newStore(t)) })
}

func change(key, from, id string, kind proto.Kind, ref uint64, body string) *Row {
	r := &Row{Key: key, From: from, ID: []byte(id), Kind: kind, Ref: ref}
	if body != "" {
		r.Body = []byte(body)
	}
	return r
}

// commitRows commits rows, failing only on a batch error: rows answer
// for themselves.
func commitRows(t *testing.T, st Store, rows ...*Row) {
	t.Helper()
	if err := st.CommitBatch(context.Background(), rows); err != nil {
		t.Fatalf("CommitBatch: %v", err)
	}
}

func wantErr(t *testing.T, r *Row, want error) {
	t.Helper()
	if !errors.Is(r.Err, want) || r.Seq != 0 {
		t.Fatalf("%s %s ref %d: %+v, want %v and no seq", r.ID, r.Kind, r.Ref, r.Stored, want)
	}
}

func wantNew(t *testing.T, r *Row) {
	t.Helper()
	if r.Err != nil || r.Duplicate || r.Seq == 0 {
		t.Fatalf("%s %s ref %d: %+v, want stored", r.ID, r.Kind, r.Ref, r.Stored)
	}
}

func testKindRules(t *testing.T, st Store) {
	const key, other = "a/r", "a/other"
	m1 := req(key, "alice", "m1", `"hello"`)
	m2 := req(key, "bob", "m2", `"hi"`)
	o1 := req(other, "alice", "o1", `1`)
	commitRows(t, st, m1, m2, o1, req(other, "alice", "o2", `2`), req(other, "alice", "o3", `3`))
	last, _ := st.LastSeq(context.Background(), key)

	// Bad refs and permissions, each answered alone: the good rows of the
	// same batch are stored.
	bad := []*Row{
		change(key, "alice", "e-nothing", proto.KindEdit, 99, `"x"`),
		change(key, "alice", "e-other-room", proto.KindEdit, 3, `"x"`), // seq 3 exists in other, not here
		change(key, "bob", "e-not-his", proto.KindEdit, m1.Seq, `"x"`),
		change(key, "bob", "d-not-his", proto.KindDelete, m1.Seq, ""),
		change(key, "alice", "e-ok", proto.KindEdit, m1.Seq, `"hello!"`),
		change(key, "carol", "r-nothing", proto.KindReact, 99, `"👍"`),
	}
	commitRows(t, st, bad...)
	wantErr(t, bad[0], proto.ErrRefNotFound)
	wantErr(t, bad[1], proto.ErrRefNotFound)
	wantErr(t, bad[2], proto.ErrRefForbidden)
	wantErr(t, bad[3], proto.ErrRefForbidden)
	wantNew(t, bad[4])
	wantErr(t, bad[5], proto.ErrRefNotFound)
	if bad[4].Seq != last+1 {
		t.Fatalf("the edit got seq %d, want %d: refused rows took seqs", bad[4].Seq, last+1)
	}
	// An edit of an edit: its ref is no message.
	ee := change(key, "alice", "e-of-e", proto.KindEdit, bad[4].Seq, `"y"`)
	commitRows(t, st, ee)
	wantErr(t, ee, proto.ErrRefNotFound)
	// The API may edit anyone's message.
	api := change(key, "backend", "e-api", proto.KindEdit, m2.Seq, `"moderated"`)
	api.Any = true
	commitRows(t, st, api)
	wantNew(t, api)
	// Delete, then nothing more on it.
	del := change(key, "alice", "d1", proto.KindDelete, m1.Seq, "")
	commitRows(t, st, del)
	wantNew(t, del)
	after := []*Row{
		change(key, "alice", "e-deleted", proto.KindEdit, m1.Seq, `"z"`),
		change(key, "alice", "d-again", proto.KindDelete, m1.Seq, ""),
		change(key, "bob", "r-deleted", proto.KindReact, m1.Seq, `"👍"`),
	}
	commitRows(t, st, after...)
	for _, r := range after {
		wantErr(t, r, proto.ErrRefNotFound)
	}
	// The same (from, id) again: the same seq, nothing stored twice.
	again := change(key, "alice", "d1", proto.KindDelete, m1.Seq, "")
	commitRows(t, st, again)
	if again.Err != nil || !again.Duplicate || again.Seq != del.Seq {
		t.Fatalf("repeated delete: %+v, want duplicate of %d", again.Stored, del.Seq)
	}
	// Nothing refused was stored: the log holds the 2 messages, 2 edits
	// and the delete, with kind and ref.
	msgs, _, err := st.Range(context.Background(), key, 0, 100, Bounds{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, fmt.Sprintf("%d:%s:%d:%s", m.Seq, m.Kind, m.Ref, m.Body))
	}
	want := []string{"1:msg:0:\"hello\"", "2:msg:0:\"hi\"", "3:edit:1:\"hello!\"", "4:edit:2:\"moderated\"", "5:delete:1:"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("log %q, want %q", got, want)
	}
	f := st.(Folder)
	folded, more, err := f.Fold(context.Background(), key, FoldQuery{}, Bounds{Limit: 10})
	if err != nil || more || len(folded) != 2 {
		t.Fatalf("Fold: %v %v %+v", err, more, folded)
	}
	if !folded[0].Deleted || folded[0].Body != nil || folded[0].Edited == 0 {
		t.Fatalf("folded m1 %+v", folded[0])
	}
	if folded[1].Deleted || string(folded[1].Body) != `"moderated"` || folded[1].Edited != api.TS {
		t.Fatalf("folded m2 %+v (edit ts %d)", folded[1], api.TS)
	}
}

func testKindReactions(t *testing.T, st Store) {
	const key = "a/r"
	m := req(key, "alice", "m", `"hi"`)
	commitRows(t, st, m)
	r1 := change(key, "bob", "r1", proto.KindReact, m.Seq, `"👍"`)
	commitRows(t, st, r1)
	wantNew(t, r1)
	// A second identical react (another id, the other spelling of the same
	// string): nothing stored, the standing reaction's seq.
	r2 := change(key, "bob", "r2", proto.KindReact, m.Seq, `"\ud83d\udc4d"`)
	commitRows(t, st, r2)
	if r2.Err != nil || !r2.Duplicate || r2.Seq != r1.Seq {
		t.Fatalf("second react: %+v, want the standing %d", r2.Stored, r1.Seq)
	}
	// An unreact with nothing to remove (never reacted so): the message's seq.
	u0 := change(key, "carol", "u0", proto.KindUnreact, m.Seq, `"👍"`)
	commitRows(t, st, u0)
	if u0.Err != nil || !u0.Duplicate || u0.Seq != m.Seq {
		t.Fatalf("unreact of nothing: %+v, want duplicate of %d", u0.Stored, m.Seq)
	}
	u1 := change(key, "bob", "u1", proto.KindUnreact, m.Seq, `"👍"`)
	commitRows(t, st, u1)
	wantNew(t, u1)
	u2 := change(key, "bob", "u2", proto.KindUnreact, m.Seq, `"👍"`)
	commitRows(t, st, u2)
	if u2.Err != nil || !u2.Duplicate || u2.Seq != u1.Seq {
		t.Fatalf("second unreact: %+v, want the standing unreact %d", u2.Stored, u1.Seq)
	}
	// React again after taking it back: stored.
	r3 := change(key, "bob", "r3", proto.KindReact, m.Seq, `"👍"`)
	r4 := change(key, "carol", "r4", proto.KindReact, m.Seq, `"👍"`)
	r5 := change(key, "carol", "r5", proto.KindReact, m.Seq, `"🎉"`)
	commitRows(t, st, r3, r4, r5)
	wantNew(t, r3)
	wantNew(t, r4)
	wantNew(t, r5)
	folded, _, err := st.(Folder).Fold(context.Background(), key, FoldQuery{}, Bounds{Limit: 10})
	if err != nil || len(folded) != 1 {
		t.Fatal(err, folded)
	}
	want := []proto.Reaction{{Text: "🎉", Count: 1}, {Text: "👍", Count: 2}}
	if !reflect.DeepEqual(folded[0].Reactions, want) {
		t.Fatalf("reactions %+v, want %+v", folded[0].Reactions, want)
	}
	if last, _ := st.LastSeq(context.Background(), key); last != r5.Seq || r5.Seq != 6 {
		t.Fatalf("last %d, r5 %d: the duplicates stored something", last, r5.Seq)
	}
}

// testKindResent: a change sent again (same from and id) is answered with
// what it stored, whatever happened since, even where the rules would now
// refuse it or take it as a no-op: PostgreSQL takes a batch's keys as new
// (changesFreshSQL) and must still find these.
func testKindResent(t *testing.T, st Store) {
	const key = "a/r"
	m := req(key, "alice", "m", `"hi"`)
	commitRows(t, st, m)
	e := change(key, "alice", "e", proto.KindEdit, m.Seq, `"hi!"`)
	r := change(key, "bob", "r", proto.KindReact, m.Seq, `"👍"`)
	commitRows(t, st, e, r)
	wantNew(t, e)
	wantNew(t, r)
	// The react resent while it stands: the rules' no-op answer is its seq.
	again := func(x *Row) *Row { return change(key, x.From, string(x.ID), x.Kind, x.Ref, string(x.Body)) }
	check := func(name string, got, orig *Row) {
		t.Helper()
		if got.Err != nil || !got.Duplicate || got.Seq != orig.Seq {
			t.Fatalf("%s resent: %+v, want duplicate of %d", name, got.Stored, orig.Seq)
		}
	}
	fresh := func() { // PostgreSQL: the next batch takes its keys as new
		if p, ok := st.(*Postgres); ok {
			p.checkUntil.Store(0)
		}
	}
	fresh()
	r2 := again(r)
	commitRows(t, st, r2)
	check("react", r2, r)
	// Taken back, then the react resent: the rules would store it again.
	u := change(key, "bob", "u", proto.KindUnreact, m.Seq, `"👍"`)
	commitRows(t, st, u)
	wantNew(t, u)
	fresh()
	r3 := again(r)
	commitRows(t, st, r3)
	check("react after its unreact", r3, r)
	// Deleted, then the edit resent: the rules would answer not_found.
	d := change(key, "alice", "d", proto.KindDelete, m.Seq, "")
	commitRows(t, st, d)
	wantNew(t, d)
	fresh()
	e2, u2 := again(e), again(u)
	commitRows(t, st, e2, u2)
	check("edit after the delete", e2, e)
	check("unreact after the delete", u2, u)
	if last, _ := st.LastSeq(context.Background(), key); last != d.Seq {
		t.Fatalf("last %d, delete %d: a resend stored something", last, d.Seq)
	}
}

func testKindSameBatch(t *testing.T, st Store) {
	const key = "a/r"
	m := req(key, "alice", "m", `"v1"`)
	rows := []*Row{
		m,
		change(key, "alice", "e1", proto.KindEdit, 1, `"v2"`),
		change(key, "bob", "r1", proto.KindReact, 1, `"x"`),
		change(key, "bob", "r2", proto.KindReact, 1, `"x"`),
		change(key, "bob", "u1", proto.KindUnreact, 1, `"x"`),
		change(key, "bob", "e2", proto.KindEdit, 1, `"no"`),
		change(key, "alice", "e1", proto.KindEdit, 1, `"v2"`), // a repeat of e1's key
		change(key, "alice", "d1", proto.KindDelete, 1, ""),
		change(key, "alice", "e3", proto.KindEdit, 1, `"late"`),
	}
	commitRows(t, st, rows...)
	wantNew(t, rows[1])
	wantNew(t, rows[2])
	if r := rows[3]; r.Err != nil || !r.Duplicate || r.Seq != rows[2].Seq {
		t.Fatalf("second react in the batch: %+v", r.Stored)
	}
	wantNew(t, rows[4])
	wantErr(t, rows[5], proto.ErrRefForbidden)
	if r := rows[6]; r.Err != nil || !r.Duplicate || r.Seq != rows[1].Seq {
		t.Fatalf("repeated key in the batch: %+v", r.Stored)
	}
	wantNew(t, rows[7])
	wantErr(t, rows[8], proto.ErrRefNotFound)
	var seqs []uint64
	for _, r := range rows {
		seqs = append(seqs, r.Seq)
	}
	if want := []uint64{1, 2, 3, 3, 4, 0, 2, 5, 0}; !reflect.DeepEqual(seqs, want) {
		t.Fatalf("seqs %v, want %v", seqs, want)
	}
}

// foldModel is what a folded history must show.
type foldModel struct {
	from    string
	body    string
	ts      int64
	edited  int64
	deleted bool
	users   map[[2]string]bool
}

func (m *foldModel) reactions() []proto.Reaction {
	counts := map[string]int{}
	for k, on := range m.users {
		if on {
			counts[k[1]]++
		}
	}
	return sortedReactions(counts)
}

// testFoldModel publishes n random messages, edits, deletes and
// reactions (some refused by the rules), the first plain of them plain
// messages, and compares the folded history with a model: read in pages
// from both ends, and pages of every size from around the room's first
// change (PostgreSQL reads the messages before it by another index).
func testFoldModel(t *testing.T, st Store, n, plain int) {
	const key = "a/fold"
	rng := rand.New(rand.NewPCG(1, 2))
	users := []string{"u0", "u1", "u2", "u3"}
	reactions := []string{`"👍"`, `"🎉"`, `"a"`}
	model := map[uint64]*foldModel{}
	var order []uint64
	var batch []*Row
	id := 0
	flush := func() {
		commitRows(t, st, batch...)
		for _, r := range batch {
			if r.Err != nil || r.Duplicate {
				continue
			}
			switch r.Kind {
			case proto.KindMsg:
				model[r.Seq] = &foldModel{from: r.From, body: string(r.Body), ts: r.TS, users: map[[2]string]bool{}}
				order = append(order, r.Seq)
			case proto.KindEdit:
				model[r.Ref].body, model[r.Ref].edited = string(r.Body), r.TS
			case proto.KindDelete:
				model[r.Ref].deleted = true
			case proto.KindReact, proto.KindUnreact:
				text, _ := proto.ReactionText(nil, r.Body)
				model[r.Ref].users[[2]string{r.From, string(text)}] = r.Kind == proto.KindReact
			}
		}
		batch = batch[:0]
	}
	for range n {
		id++
		u := users[rng.IntN(len(users))]
		var r *Row
		if len(order) == 0 || len(order) < plain || rng.IntN(4) == 0 {
			r = req(key, u, fmt.Sprint(id), fmt.Sprintf(`{"n":%d}`, id))
		} else {
			ref := order[rng.IntN(len(order))]
			if rng.IntN(50) == 0 {
				ref = uint64(rng.IntN(int(order[len(order)-1]) + 5)) // maybe no message
			}
			switch k := rng.IntN(10); {
			case k < 2:
				r = change(key, u, fmt.Sprint(id), proto.KindEdit, ref, fmt.Sprintf(`"edit %d"`, id))
			case k < 3:
				r = change(key, u, fmt.Sprint(id), proto.KindDelete, ref, "")
			case k < 7:
				r = change(key, u, fmt.Sprint(id), proto.KindReact, ref, reactions[rng.IntN(len(reactions))])
			default:
				r = change(key, u, fmt.Sprint(id), proto.KindUnreact, ref, reactions[rng.IntN(len(reactions))])
			}
			if rng.IntN(20) == 0 {
				r.Any = true
			}
		}
		batch = append(batch, r)
		if len(batch) == 1+rng.IntN(60) {
			flush()
		}
	}
	flush()
	f := st.(Folder)
	check := func(m proto.Message) {
		t.Helper()
		w := model[m.Seq]
		if w == nil || m.Kind != proto.KindMsg || !m.Folded {
			t.Fatalf("folded %d: not a message of the model (%+v)", m.Seq, m)
		}
		body := w.body
		if w.deleted {
			body = ""
		}
		if string(m.Body) != body || m.Deleted != w.deleted || m.Edited != w.edited || m.From != w.from || m.TS != w.ts ||
			!reflect.DeepEqual(m.Reactions, w.reactions()) {
			t.Fatalf("folded %d: body %s deleted %v edited %d reactions %v; model %s %v %d %v",
				m.Seq, m.Body, m.Deleted, m.Edited, m.Reactions, body, w.deleted, w.edited, w.reactions())
		}
	}
	// Backwards in pages of 50, then forwards in pages of 37.
	var seen []uint64
	before := uint64(0)
	for {
		msgs, more, err := f.Fold(context.Background(), key, FoldQuery{Before: before}, Bounds{Limit: 50, MaxBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) > 50 || more && len(msgs) != 50 {
			t.Fatalf("page of %d, more %v", len(msgs), more)
		}
		for i := len(msgs) - 1; i >= 0; i-- {
			check(msgs[i])
			seen = append(seen, msgs[i].Seq)
		}
		if !more {
			break
		}
		before = msgs[0].Seq
	}
	if len(seen) != len(order) {
		t.Fatalf("folded %d messages backwards, model %d", len(seen), len(order))
	}
	for i, s := range seen {
		if order[len(order)-1-i] != s {
			t.Fatalf("folded order differs at %d", i)
		}
	}
	after, count := uint64(0), 0
	for {
		msgs, more, err := f.Fold(context.Background(), key, FoldQuery{After: after, Forward: true}, Bounds{Limit: 37})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Seq != order[count] {
				t.Fatalf("forward: %d, want %d", m.Seq, order[count])
			}
			check(m)
			count++
		}
		if !more {
			break
		}
		after = msgs[len(msgs)-1].Seq
	}
	if count != len(order) {
		t.Fatalf("folded %d messages forwards, model %d", count, len(order))
	}
	// Pages of every size from around the first change, both ways.
	first := uint64(0)
	for s := uint64(1); first == 0; s++ {
		if model[s] == nil {
			first = s
		}
	}
	for limit := 1; limit <= 60; limit += 7 {
		for _, d := range []int{-30, -3, -1, 0, 1, 2, 25} {
			if int(first)+d < 1 {
				continue // Before 0 is the newest page
			}
			from := uint64(int(first) + d)
			back, more, err := f.Fold(context.Background(), key, FoldQuery{Before: from}, Bounds{Limit: limit})
			if err != nil {
				t.Fatal(err)
			}
			want := []uint64{}
			for i := len(order) - 1; i >= 0 && len(want) <= limit; i-- {
				if order[i] < from {
					want = append([]uint64{order[i]}, want...)
				}
			}
			wantMore := len(want) > limit
			if wantMore {
				want = want[1:]
			}
			if got := foldedSeqs(back); !reflect.DeepEqual(got, want) || more != wantMore {
				t.Fatalf("%d before %d: %v more %v, want %v more %v", limit, from, got, more, want, wantMore)
			}
			fwd, more, err := f.Fold(context.Background(), key, FoldQuery{After: from, Forward: true}, Bounds{Limit: limit})
			if err != nil {
				t.Fatal(err)
			}
			want = want[:0]
			for _, s := range order {
				if s > from && len(want) <= limit {
					want = append(want, s)
				}
			}
			wantMore = len(want) > limit
			if wantMore {
				want = want[:limit]
			}
			if got := foldedSeqs(fwd); !reflect.DeepEqual(got, want) || more != wantMore {
				t.Fatalf("%d after %d: %v more %v, want %v more %v", limit, from, got, more, want, wantMore)
			}
			for _, m := range append(back, fwd...) {
				check(m)
			}
		}
	}
}

func foldedSeqs(msgs []proto.Message) []uint64 {
	seqs := []uint64{}
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
	}
	return seqs
}

func testUnreadCountKinds(t *testing.T, st Store) {
	const key = "a/u"
	rd := st.(Reads)
	rows := []*Row{
		req(key, "bob", "1", `1`),                              // 1
		req(key, "bob", "2", `2`),                              // 2
		change(key, "bob", "3", proto.KindEdit, 1, `"e"`),      // 3
		change(key, "alice", "4", proto.KindReact, 2, `"x"`),   // 4
		req(key, "bob", "5", `5`),                              // 5
		change(key, "bob", "6", proto.KindDelete, 5, ""),       // 6
		change(key, "alice", "7", proto.KindUnreact, 2, `"x"`), // 7
		req(key, "bob", "8", `8`),                              // 8
	}
	commitRows(t, st, rows...)
	for _, tc := range []struct{ read, count uint64 }{{0, 4}, {1, 3}, {2, 2}, {3, 2}, {4, 2}, {5, 1}, {7, 1}, {8, 0}, {50, 0}} {
		if err := rd.SaveReads(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		last, read, count := []uint64{0}, []uint64{tc.read}, []uint64{0}
		if err := rd.Unread(context.Background(), []string{key}, "carol", last, read, count); err != nil {
			t.Fatal(err)
		}
		if last[0] != 8 || read[0] != tc.read || count[0] != tc.count {
			t.Errorf("read %d: last %d read %d count %d, want count %d", tc.read, last[0], read[0], count[0], tc.count)
		}
	}
	// The stored position counts too.
	if err := rd.SaveReads(context.Background(), []ReadMark{{Key: key, User: "carol", Seq: 4}}); err != nil {
		t.Fatal(err)
	}
	last, read, count := []uint64{0}, []uint64{0}, []uint64{0}
	if err := rd.Unread(context.Background(), []string{key}, "carol", last, read, count); err != nil {
		t.Fatal(err)
	}
	if read[0] != 4 || count[0] != 2 {
		t.Fatalf("stored position 4: read %d count %d", read[0], count[0])
	}
}

func TestMemoryKinds(t *testing.T) {
	testKindsContract(t, func(t *testing.T) Store { return NewMemory(100000) })
}

// TestMemoryRetentionRemovesChanges: a message leaving the ring takes its
// edits and reactions with it, wherever they are in the ring.
func TestMemoryRetentionRemovesChanges(t *testing.T) {
	st := NewMemory(4)
	const key = "a/r"
	m1 := req(key, "alice", "m1", `1`)
	commitRows(t, st, m1, req(key, "alice", "m2", `2`))
	e := change(key, "alice", "e", proto.KindEdit, 1, `"x"`)
	r := change(key, "bob", "r", proto.KindReact, 2, `"y"`)
	commitRows(t, st, e, r)                         // seqs 3, 4: the ring is full
	commitRows(t, st, req(key, "alice", "m5", `5`)) // m1 goes, and its edit 3 with it
	msgs, _, _ := st.Range(context.Background(), key, 0, 10, Bounds{Limit: 10})
	var seqs []uint64
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
	}
	if !reflect.DeepEqual(seqs, []uint64{2, 4, 5}) {
		t.Fatalf("kept %v, want [2 4 5]", seqs)
	}
	// Its key is forgotten with it: a re-publish is refused as a change of
	// nothing, not answered as a duplicate.
	again := change(key, "alice", "e", proto.KindEdit, 1, `"x"`)
	commitRows(t, st, again)
	wantErr(t, again, proto.ErrRefNotFound)
	folded, _, _ := st.Fold(context.Background(), key, FoldQuery{}, Bounds{Limit: 10})
	if len(folded) != 2 || folded[0].Seq != 2 || len(folded[0].Reactions) != 1 {
		t.Fatalf("folded %+v", folded)
	}
	if strings.Contains(fmt.Sprint(st.Stats()), "-") {
		t.Fatalf("negative accounting: %+v", st.Stats())
	}
}

// TestMemoryChangesAccounted: a message's state counts against the byte
// budget and leaves it with the message.
func TestMemoryChangesAccounted(t *testing.T) {
	st := NewMemory(10)
	const key = "a/r"
	commitRows(t, st, req(key, "alice", "m", `1`))
	before := st.Stats().Bytes
	var rows []*Row
	for i := range 5 {
		rows = append(rows, change(key, fmt.Sprint("u", i), fmt.Sprint("r", i), proto.KindReact, 1, `"👍"`))
	}
	commitRows(t, st, rows...)
	grown := st.Stats().Bytes
	if grown <= before+5*msgCost {
		t.Fatalf("5 reactions grew the store from %d to %d bytes: the state is not counted", before, grown)
	}
	for i := range 10 {
		commitRows(t, st, req(key, "alice", fmt.Sprint("n", i), `1`))
	}
	// The ring holds the 10 newest messages, none of them changed: what
	// the reactions and their state held is given back.
	plain := NewMemory(10)
	for i := range 10 {
		commitRows(t, plain, req(key, "alice", fmt.Sprint("n", i), `1`))
	}
	if got, want := st.Stats().Bytes, plain.Stats().Bytes; got != want {
		t.Fatalf("after the changed message left: %d bytes, a store that never had it %d", got, want)
	}
}

func TestPostgresKinds(t *testing.T) {
	testKindsContract(t, func(t *testing.T) Store { return newPG(t) })
}

// TestPostgresRetentionRemovesChanges: retention by count removes a
// message with its edits and reactions, the newer ones too, and its state.
func TestPostgresRetentionRemovesChanges(t *testing.T) {
	st := newPG(t)
	ctx := context.Background()
	const key = "a/r"
	commitRows(t, st, req(key, "alice", "m1", `1`), req(key, "alice", "m2", `2`))
	commitRows(t, st, change(key, "alice", "e", proto.KindEdit, 1, `"x"`), change(key, "bob", "r", proto.KindReact, 2, `"y"`))
	for i := 5; i <= 8; i++ {
		commitRows(t, st, req(key, "alice", fmt.Sprint("m", i), `0`))
	}
	commitRows(t, st, change(key, "bob", "r1", proto.KindReact, 1, `"late"`)) // 9
	keep(t, st, "a", 0, 7)                                                    // removes 1 and 2, with 1 its edit 3 and its reaction 9, with 2 its reaction 4
	if _, err := st.EnforceRetention(ctx); err != nil {
		t.Fatal(err)
	}
	msgs, _, err := st.Range(ctx, key, 0, 100, Bounds{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
	}
	if !reflect.DeepEqual(seqs, []uint64{5, 6, 7, 8}) {
		t.Fatalf("kept %v, want [5 6 7 8]", seqs)
	}
	var states, reacts int
	if err := st.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM message_state), (SELECT count(*) FROM messages WHERE kind IN (3, 4) AND ref NOT IN (SELECT seq FROM messages WHERE kind = 0))`).Scan(&states, &reacts); err != nil {
		t.Fatal(err)
	}
	if states != 0 || reacts != 0 {
		t.Fatalf("%d states and %d reactions left of removed messages", states, reacts)
	}
	// The removed ones' keys are free, their refs gone.
	again := change(key, "alice", "e", proto.KindEdit, 1, `"x"`)
	commitRows(t, st, again)
	wantErr(t, again, proto.ErrRefNotFound)
}

// TestPostgresChangesTwoStores: two stores (two nodes) on one database
// react to the same message at once, the same users on both: each user's
// reaction is stored once, the other answered with its seq, and the count
// is the number of users.
func TestPostgresChangesTwoStores(t *testing.T) {
	url := newTestDB(t)
	a, b := openTestPG(t, url, PGConfig{}), openTestPG(t, url, PGConfig{})
	defer a.Close()
	defer b.Close()
	const key, users = "a/hot", 60
	m := req(key, "author", "m", `"hi"`)
	commitRows(t, a, m)
	errs := make(chan error, 2)
	answers := make([][]*Row, 2)
	for i, st := range []*Postgres{a, b} {
		go func() {
			var all []*Row
			for start := 0; start < users; start += 7 {
				var batch []*Row
				for u := start; u < min(start+7, users); u++ {
					batch = append(batch, change(key, fmt.Sprint("u", u), fmt.Sprint("r", i, "-", u), proto.KindReact, m.Seq, `"👍"`))
				}
				if err := st.CommitBatch(context.Background(), batch); err != nil {
					errs <- err
					return
				}
				all = append(all, batch...)
			}
			answers[i] = all
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	stored := map[string]uint64{}
	for i := range answers {
		for _, r := range answers[i] {
			if r.Err != nil {
				t.Fatalf("%s: %v", r.ID, r.Err)
			}
			if !r.Duplicate {
				if _, twice := stored[r.From]; twice {
					t.Fatalf("%s's reaction stored twice", r.From)
				}
				stored[r.From] = r.Seq
			}
		}
	}
	for i := range answers {
		for _, r := range answers[i] {
			if r.Duplicate && r.Seq != stored[r.From] {
				t.Fatalf("%s answered %d, its reaction is %d", r.ID, r.Seq, stored[r.From])
			}
		}
	}
	folded, _, err := a.Fold(context.Background(), key, FoldQuery{}, Bounds{Limit: 5})
	if err != nil || len(stored) != users || len(folded) != 1 || len(folded[0].Reactions) != 1 || folded[0].Reactions[0].Count != users {
		t.Fatalf("%d stored, folded %+v, %v", len(stored), folded, err)
	}
}

// TestPostgresResolveChangesInDoubt: a changes commit whose answer was
// lost is settled by its token: committed, its new entries are answered
// as new, and the rows that stored nothing (a standing reaction, a bad
// ref) overloaded, so their clients send them again and get the rules'
// answer; rolled back, all overloaded.
func TestPostgresResolveChangesInDoubt(t *testing.T) {
	ctx := context.Background()
	st := newPG(t)
	const k = "app/r"
	commitRows(t, st, req(k, "alice", "m", `"hi"`), change(k, "bob", "r0", proto.KindReact, 1, `"x"`))
	cause := errors.New("connection reset during COMMIT")
	run := func(rows []*Row, token int64, execute bool) error {
		s := st.scratchPool.Get().(*pgScratch)
		s.reset(len(rows))
		if err := st.prepare(ctx, s, rows); err != nil {
			t.Fatal(err)
		}
		if execute {
			conn, err := st.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.runCommit(ctx, conn, changesSQL, s, rows, token); err != nil {
				t.Fatal(err)
			}
			conn.Release()
		}
		for _, r := range rows {
			r.Stored = Stored{}
		}
		return st.resolve(s, rows, token, cause)
	}
	rows := []*Row{
		change(k, "alice", "e", proto.KindEdit, 1, `"hi!"`),
		change(k, "bob", "r1", proto.KindReact, 1, `"x"`), // stands: nothing stored
		change(k, "bob", "bad", proto.KindEdit, 9, `"x"`),
	}
	if err := run(rows, 77, true); err != nil {
		t.Fatal(err)
	}
	if rows[0].Err != nil || rows[0].Seq != 3 || rows[0].Duplicate {
		t.Fatalf("the edit: %+v", rows[0].Stored)
	}
	for _, r := range rows[1:] {
		if !errors.Is(r.Err, proto.ErrOverloaded) {
			t.Fatalf("%s: %+v, want overloaded", r.ID, r.Stored)
		}
	}
	// Sent again, they get the rules' answers.
	again := []*Row{change(k, "bob", "r1", proto.KindReact, 1, `"x"`), change(k, "bob", "bad", proto.KindEdit, 9, `"x"`)}
	commitRows(t, st, again...)
	if !again[0].Duplicate || again[0].Seq != 2 {
		t.Fatalf("r1 again: %+v", again[0].Stored)
	}
	wantErr(t, again[1], proto.ErrRefNotFound)
	// Rolled back: overloaded.
	if err := run([]*Row{change(k, "alice", "d", proto.KindDelete, 1, "")}, 78, false); !errors.Is(err, proto.ErrOverloaded) && !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("rolled back: %v", err)
	}
	if last, _ := st.LastSeq(ctx, k); last != 3 {
		t.Fatalf("last %d, want 3", last)
	}
}

// TestPostgresChangesKnownStale: a store commits a room's changes from
// what it knows of the room (one round trip) only while nothing else wrote
// to it: another node's reaction, or a message removed under it (retention
// on another node), sends the batch the long way, answered as if alone.
func TestPostgresChangesKnownStale(t *testing.T) {
	url := newTestDB(t)
	// a on one connection: the batch it sends again after a failed guard
	// goes on the connection whose implicit transaction the guard failed.
	a, b := openTestPG(t, url, PGConfig{MaxConns: 1}), openTestPG(t, url, PGConfig{})
	defer a.Close()
	defer b.Close()
	const key = "a/r"
	m, m2 := req(key, "author", "m", `"hi"`), req(key, "author", "m2", `"hi"`)
	commitRows(t, a, m, m2)
	r1 := change(key, "u1", "r1", proto.KindReact, m.Seq, `"👍"`)
	commitRows(t, a, r1)
	wantNew(t, r1)
	if a.CommitStats().Stale != 0 {
		t.Fatalf("stale %d before any other writer", a.CommitStats().Stale)
	}
	// The other node takes the reaction back; a knows it as standing.
	u1 := change(key, "u1", "u1", proto.KindUnreact, m.Seq, `"👍"`)
	commitRows(t, b, u1)
	wantNew(t, u1)
	u2 := change(key, "u1", "u2", proto.KindUnreact, m.Seq, `"👍"`)
	commitRows(t, a, u2)
	if u2.Err != nil || !u2.Duplicate || u2.Seq != u1.Seq {
		t.Fatalf("unreact after the other node's: %+v, want the standing %d", u2.Stored, u1.Seq)
	}
	if a.CommitStats().Stale != 1 {
		t.Fatalf("stale %d, want 1", a.CommitStats().Stale)
	}
	// Known again (a read it all the long way): one round trip.
	r2 := change(key, "u2", "r2", proto.KindReact, m2.Seq, `"🎉"`)
	commitRows(t, a, r2)
	wantNew(t, r2)
	if a.CommitStats().Stale != 1 {
		t.Fatalf("stale %d, want still 1", a.CommitStats().Stale)
	}
	// Committed from what a knew (no BEGIN, no COMMIT: the pipeline's
	// implicit transaction, committed at its Sync): another store sees it,
	// and its time is the transaction's, as stored.
	stored, _, err := b.Range(context.Background(), key, r2.Seq-1, r2.Seq, Bounds{Limit: 1})
	if err != nil || len(stored) != 1 || stored[0].TS != r2.TS || r2.TS <= 0 {
		t.Fatalf("r2 acked at %d, stored %+v, %v", r2.TS, stored, err)
	}
	// m2 removed under a (as retention on another node would): no longer
	// a message to react to.
	if _, err := b.pool.Exec(context.Background(), `DELETE FROM messages WHERE seq = $1 OR ref = $1`, int64(m2.Seq)); err != nil {
		t.Fatal(err)
	}
	r3 := change(key, "u2", "r3", proto.KindUnreact, m2.Seq, `"🎉"`)
	commitRows(t, a, r3)
	wantErr(t, r3, proto.ErrRefNotFound)
	if a.CommitStats().Stale != 2 {
		t.Fatalf("stale %d, want 2", a.CommitStats().Stale)
	}
}

// TestPostgresChangesKnownKeptFrom: retention (on another node) removes
// messages a node knows, moving no room's last_seq; a reaction to one,
// committed from what the node knows, must answer not_found (the guard
// checks the room's kept_from, which retention raises itself: the
// trigger of 0014 is dropped here), and a reaction to a message kept
// still goes in one round trip.
func TestPostgresChangesKnownKeptFrom(t *testing.T) {
	for _, by := range []string{"count", "age"} {
		t.Run(by, func(t *testing.T) {
			ctx := context.Background()
			url := newTestDB(t)
			a, b := openTestPG(t, url, PGConfig{MaxConns: 1}), openTestPG(t, url, PGConfig{})
			defer a.Close()
			defer b.Close()
			if _, err := b.pool.Exec(ctx, `DROP TRIGGER messages_removed ON messages`); err != nil {
				t.Fatal(err)
			}
			const key = "a/r"
			commitRows(t, a, req(key, "author", "m1", `1`), req(key, "author", "m2", `2`), req(key, "author", "m3", `3`), req(key, "author", "m4", `4`))
			// The long way: a learns the room, messages 1, 2 and 3 and u1's
			// reactions to them (the changes below are all u1's: known).
			commitRows(t, a, change(key, "u1", "r1", proto.KindReact, 1, `"👍"`), change(key, "u1", "r2", proto.KindReact, 2, `"👍"`),
				change(key, "u1", "r3", proto.KindReact, 3, `"👍"`)) // 5, 6, 7
			r4 := change(key, "u1", "r4", proto.KindUnreact, 2, `"👍"`) // 8, from what a knows
			commitRows(t, a, r4)
			wantNew(t, r4)
			if by == "count" {
				keep(t, b, "a", 0, 6) // removes 1 and 2, with them 5, 6 and 8
			} else {
				if _, err := b.pool.Exec(ctx, `UPDATE messages SET ts = ts - interval '1 hour' WHERE seq <= 2`); err != nil {
					t.Fatal(err)
				}
				keep(t, b, "a", 30*time.Minute, 0)
			}
			if n, err := b.EnforceRetention(ctx); err != nil || n != 5 {
				t.Fatalf("retention removed %d, %v; want 5", n, err)
			}
			var last, kept int64
			if err := b.pool.QueryRow(ctx, `SELECT last_seq, kept_from FROM rooms WHERE name = 'r'`).Scan(&last, &kept); err != nil || last != 8 || kept != 3 {
				t.Fatalf("room last_seq %d kept_from %d, %v; want 8 and 3", last, kept, err)
			}
			r5 := change(key, "u1", "r5", proto.KindUnreact, 3, `"👍"`)
			commitRows(t, a, r5)
			wantNew(t, r5)
			if s := a.CommitStats().Stale; s != 0 {
				t.Fatalf("stale %d reacting to a message kept, want 0", s)
			}
			r6 := change(key, "u1", "r6", proto.KindUnreact, 1, `"👍"`)
			commitRows(t, a, r6)
			wantErr(t, r6, proto.ErrRefNotFound)
			if s := a.CommitStats().Stale; s != 1 {
				t.Fatalf("stale %d after reacting to a removed message, want 1", s)
			}
		})
	}
}

// TestPostgresChangesGuardPlan: the guard of a batch committed from what
// the node knows reads the rooms' rows alone, locked in id order.
func TestPostgresChangesGuardPlan(t *testing.T) {
	st := newPG(t)
	text := genericPlan(t, st, nil, "guard_plan", "int8[], int8[], int8[]", changesGuardSQL, `'{1}', '{1}', '{1}'`)
	if strings.Contains(text, "messages") || !strings.Contains(text, "LockRows") || !strings.Contains(text, "Sort Key: r.id") {
		t.Fatalf("guard plan reads more than the rooms or locks them out of order:\n%s", text)
	}
}

// TestPostgresChangesIndexPlans: the two lookups messages_changes serves
// descend it, planned generic on an empty table: a user's standing
// reaction (its key in full, hash of sender and reaction since 0016, the
// latest entry first) and retention's changes of a removed message (by
// room and ref). Either read by another path walks the room's entries.
func TestPostgresChangesIndexPlans(t *testing.T) {
	st := newPG(t)
	read := genericPlan(t, st, nil, "changes_read_plan", "int8[], text[], bytea[], int4[], int8[], int8[], int8[], int8[], text[], text[]", changesReadSQL,
		`'{1}', '{u}', '{"\\x41"}', '{0}', '{1}', '{1}', '{1}', '{1}', '{u}', '{x}'`)
	standing := read[strings.LastIndex(read, "Function Scan"):]
	if !regexp.MustCompile(`Index Scan Backward using messages_changes on messages m(?:_\d+)? .*\n\s+Index Cond: \(\(room_id = k\.room_id\) AND \(ref = k\.seq\) AND \(hashtextextended\(sender, hashtextextended\(reaction, .*\n\s+Filter: \(\(sender = k\.sender\) AND \(reaction = k\.reaction\)\)`).MatchString(standing) {
		t.Fatalf("standing reaction lookup does not descend messages_changes by its key:\n%s", read)
	}
	del := genericPlan(t, st, nil, "retention_plan", "int8, int8, int8", withChanges(`
DELETE FROM messages WHERE room_id = $1 AND seq IN (
	SELECT seq FROM messages WHERE room_id = $1 AND seq <= $2 ORDER BY seq LIMIT $3)`), "1, 1, 1")
	if !regexp.MustCompile(`Index Scan using messages_changes on messages x .*\n\s+Index Cond: \(\(room_id = \$1\) AND \(ref = d(?:_\d+)?\.seq\)\)`).MatchString(del) {
		t.Fatalf("retention does not find a message's changes by messages_changes:\n%s", del)
	}
}

// TestPostgresNodesReactInSharedRooms: nodes (one store each, one
// database) commit batches of reactions, unreactions and messages over
// rooms they share, some from what each node knows (one round trip whose
// guard locks the rooms first) and the others the long way after another
// node wrote: no deadlock, no failed publish, every room's seqs
// dense, and every message's counts those of its log (each user's latest
// react or unreact of each reaction).
func TestPostgresNodesReactInSharedRooms(t *testing.T) {
	const nodes, rooms, msgs, batches = 3, 12, 2, 80
	url, stores := nodeStores(t, nodes)
	ctx := context.Background()
	key := func(r int) string { return proto.RoomKey("app", fmt.Sprint("room", r)) }
	refs := make([][]uint64, rooms)
	for r := range rooms {
		for m := range msgs {
			row := req(key(r), "author", fmt.Sprint("m", m), `"hi"`)
			commitRows(t, stores[0], row)
			refs[r] = append(refs[r], row.Seq)
		}
	}
	before := deadlocks(t, url)
	var wg sync.WaitGroup
	var failed, known atomic.Int64
	for n, st := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(n), 27))
			for b := range batches {
				// Mostly the node's own share of the rooms, one in five
				// batches over any rooms, in no order.
				rows := make([]*Row, 1+rng.IntN(20))
				spread := rng.IntN(5) == 0
				for i := range rows {
					r := (n + nodes*rng.IntN(rooms/nodes)) % rooms
					if spread {
						r = rng.IntN(rooms)
					}
					id := fmt.Sprintf("n%d-b%d-%d", n, b, i)
					from := fmt.Sprint("u", rng.IntN(3))
					switch rng.IntN(8) {
					case 0:
						rows[i] = req(key(r), from, id, `"m"`)
					default:
						kind := proto.KindReact
						if rng.IntN(2) == 0 {
							kind = proto.KindUnreact
						}
						rows[i] = change(key(r), from, id, kind, refs[r][rng.IntN(msgs)], []string{`"👍"`, `"🎉"`}[rng.IntN(2)])
					}
				}
				if knows(ctx, t, st, rows) {
					known.Add(1)
				}
				if err := st.CommitBatch(ctx, rows); err != nil {
					t.Errorf("node %d batch %d: %v", n, b, err)
				}
				for _, row := range rows {
					if row.Err != nil {
						failed.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	var stale uint64
	for _, st := range stores {
		stale += st.CommitStats().Stale
		st.pool.Reset() // a backend reports its statistics when it exits
	}
	var got int64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = deadlocks(t, url) - before; got > 0 {
			break
		}
	}
	t.Logf("%d batches from %d nodes over %d rooms: %d from what the node knew, %d of them stale; %d deadlocks",
		nodes*batches, nodes, rooms, known.Load(), stale, got)
	if got > 0 || failed.Load() > 0 {
		t.Fatalf("%d deadlocks, %d publishes failed", got, failed.Load())
	}
	if stale == 0 || uint64(known.Load()) <= stale {
		t.Fatalf("%d batches from what the node knew, %d stale: want both ways taken", known.Load(), stale)
	}
	var bad int64
	if err := stores[0].pool.QueryRow(ctx, `
SELECT count(*) FROM rooms r WHERE r.app = 'app' AND r.last_seq <> (SELECT count(*) FROM messages m WHERE m.room_id = r.id)`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d rooms whose seqs are not dense (%v)", bad, err)
	}
	// Counts from the log against the counts kept.
	if err := stores[0].pool.QueryRow(ctx, `
WITH latest AS (
	SELECT DISTINCT ON (room_id, ref, sender, reaction) room_id, ref, reaction, kind
	FROM messages WHERE kind IN (3, 4) ORDER BY room_id, ref, sender, reaction, seq DESC
), logged AS (
	SELECT room_id, ref, jsonb_object_agg(reaction, n) AS reactions FROM (
		SELECT room_id, ref, reaction, count(*) AS n FROM latest WHERE kind = 3 GROUP BY 1, 2, 3) c
	GROUP BY 1, 2
)
SELECT count(*) FROM logged l FULL JOIN (SELECT * FROM message_state WHERE reactions <> '{}') s ON s.room_id = l.room_id AND s.seq = l.ref
WHERE l.reactions IS DISTINCT FROM s.reactions`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d messages whose counts are not their log's (%v)", bad, err)
	}
}

// knows tells whether st would commit rows (a batch holding changes) from
// what it knows of their rooms.
func knows(ctx context.Context, t *testing.T, st *Postgres, rows []*Row) bool {
	s := &pgScratch{}
	seen := map[int64]bool{}
	for i, r := range rows {
		id, _, err := st.roomID(ctx, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !seen[id] {
			seen[id] = true
			s.rooms = append(s.rooms, id)
		}
		s.uOrd, s.uRoom, s.uKind, s.uRef, s.uSender = append(s.uOrd, int32(i)), append(s.uRoom, id), append(s.uKind, int16(r.Kind)), append(s.uRef, int64(r.Ref)), append(s.uSender, r.From)
		s.uText = append(s.uText, strings.Trim(string(r.Body), `"`))
	}
	return st.kc.known(s) != nil
}

// TestMigrateChangesIndexBuiltAhead: migration 0016 takes a
// messages_changes_0016 an operator built ahead (CREATE INDEX
// CONCURRENTLY, docs/operations.md) in place of building its own, and
// builds its own when the one there is not valid or not its definition.
func TestMigrateChangesIndexBuiltAhead(t *testing.T) {
	const def = `(room_id, ref, hashtextextended(sender, hashtextextended(reaction, 0)), seq) WHERE ref IS NOT NULL`
	for _, c := range []struct {
		name  string
		ahead string // the statements run before the migration
		kept  bool   // the index built ahead is the one left
	}{
		{"none", ``, false},
		{"built ahead", `CREATE INDEX CONCURRENTLY messages_changes_0016 ON messages ` + def, true},
		{"not valid", `CREATE INDEX CONCURRENTLY messages_changes_0016 ON messages ` + def + `;
UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'messages_changes_0016'::regclass`, false},
		{"another definition", `CREATE INDEX CONCURRENTLY messages_changes_0016 ON messages (room_id, ref, seq) WHERE ref IS NOT NULL`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			url, conn := olderSchema(t, 15)
			var ahead uint32
			if c.ahead != "" {
				for _, stmt := range strings.Split(c.ahead, ";\n") {
					if _, err := conn.Exec(ctx, stmt); err != nil {
						t.Fatal(err)
					}
				}
				if err := conn.QueryRow(ctx, `SELECT 'messages_changes_0016'::regclass::oid`).Scan(&ahead); err != nil {
					t.Fatal(err)
				}
			}
			if err := Migrate(ctx, url); err != nil {
				t.Fatal(err)
			}
			var oid uint32
			var valid bool
			var got string
			if err := conn.QueryRow(ctx, `SELECT i.indexrelid, i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indexrelid = 'messages_changes'::regclass`).Scan(&oid, &valid, &got); err != nil {
				t.Fatal(err)
			}
			if !valid || !strings.Contains(got, `USING btree (room_id, ref, hashtextextended(sender, hashtextextended(reaction, (0)::bigint)), seq) WHERE (ref IS NOT NULL)`) {
				t.Fatalf("messages_changes after 0016: valid %v, %s", valid, got)
			}
			if (oid == ahead) != c.kept {
				t.Fatalf("the index built ahead kept: %v, want %v", oid == ahead, c.kept)
			}
			var left int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'messages_changes_0016'`).Scan(&left); err != nil || left != 0 {
				t.Fatalf("messages_changes_0016 left behind: %d, %v", left, err)
			}
		})
	}
}
