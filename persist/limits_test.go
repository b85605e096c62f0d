package persist

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/roost-chat/roost/proto"
)

func commitRes(t *testing.T, st Store, reqs ...*Row) []Stored {
	t.Helper()
	res := make([]Stored, len(reqs))
	if err := commitInto(context.Background(), st, reqs, res); err != nil {
		t.Fatalf("CommitBatch: %v", err)
	}
	return res
}

func historySeqs(t *testing.T, st Store, key string) []uint64 {
	t.Helper()
	msgs, _, err := st.History(context.Background(), key, 0, Bounds{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
	}
	return seqs
}

// The byte budget's rule: past it, the app holding the most bytes gives
// way, its least recently written rooms losing their oldest messages
// first. Another app keeps its history, and a room that keeps being
// written (a live chat) keeps its own while one client floods new rooms
// of the same app; seqs go on.
func TestMemoryBudgetEvictsLeastRecentlyWrittenRooms(t *testing.T) {
	const budget = 2 << 20
	m := NewMemory(1000)
	m.SetLimits(budget, 0)
	body := `"` + strings.Repeat("x", 20<<10) + `"`
	hot := proto.RoomKey("a", "hot")
	quiet := proto.RoomKey("b", "quiet") // another app, written once before the flood
	for i := 1; i <= 5; i++ {
		commitRes(t, m, req(quiet, "bob", fmt.Sprint(i), `{"q":1}`))
	}
	for i := 1; i <= 300; i++ {
		// 20 KB into a new room each time, and a small message to hot.
		commitRes(t, m, req(proto.RoomKey("a", fmt.Sprint("flood", i)), "mallory", "m", body))
		commitRes(t, m, req(hot, "alice", fmt.Sprint("h", i), `{"n":1}`))
		if b := m.Stats().Bytes; b > budget {
			t.Fatalf("after %d rooms the store holds %d bytes, budget %d", i, b, budget)
		}
	}
	st := m.Stats()
	if st.Evicted == 0 {
		t.Fatal("nothing evicted though 6 MB went into a 2 MB budget")
	}
	// hot was written last every time: all of its 300 messages are kept.
	if seqs := historySeqs(t, m, hot); len(seqs) != 300 || seqs[0] != 1 || seqs[299] != 300 {
		t.Fatalf("hot room kept %d messages (%v…), want all 300", len(seqs), seqs[:min(len(seqs), 3)])
	}
	// The app that filled the store gave way, not the other one.
	if seqs := historySeqs(t, m, quiet); len(seqs) != 5 {
		t.Fatalf("quiet room of another app kept %v, want its 5 messages", seqs)
	}
	// The oldest flood rooms are emptied, the newest are kept.
	if seqs := historySeqs(t, m, proto.RoomKey("a", "flood1")); len(seqs) != 0 {
		t.Fatalf("oldest flood room still holds %v", seqs)
	}
	if seqs := historySeqs(t, m, proto.RoomKey("a", "flood300")); len(seqs) != 1 {
		t.Fatalf("newest flood room holds %v, want its message", seqs)
	}
	// An emptied room keeps its seq and epoch, and its ring comes back.
	k := proto.RoomKey("a", "flood1")
	before, err := m.Head(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	res := commitRes(t, m, req(k, "mallory", "again", `2`))
	if res[0].Err != nil || res[0].Seq != 2 {
		t.Fatalf("publish to an emptied room: %+v, want seq 2", res[0])
	}
	after, _ := m.Head(context.Background(), k)
	if after.Epoch != before.Epoch {
		t.Fatalf("epoch changed from %q to %q: the room was dropped", before.Epoch, after.Epoch)
	}
	if seqs := historySeqs(t, m, k); len(seqs) != 1 || seqs[0] != 2 {
		t.Fatalf("emptied room then holds %v, want [2]", seqs)
	}
}

// One room bigger than the budget keeps its newest messages, contiguous.
func TestMemoryBudgetTrimsOneRoomOldestFirst(t *testing.T) {
	const budget = 1 << 20
	m := NewMemory(1000)
	m.SetLimits(budget, 0)
	k := proto.RoomKey("a", "big")
	body := `"` + strings.Repeat("y", 30<<10) + `"`
	for i := 1; i <= 100; i++ {
		commitRes(t, m, req(k, "u", fmt.Sprint(i), body))
	}
	seqs := historySeqs(t, m, k)
	if len(seqs) == 0 || len(seqs) >= 100 || seqs[len(seqs)-1] != 100 {
		t.Fatalf("kept %d messages ending %v, want the newest under 1 MB", len(seqs), seqs[len(seqs)-1:])
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("kept seqs not contiguous: %v", seqs)
		}
	}
	// An evicted message's idempotency key is gone with it: a re-send is
	// stored again (the exactly-once horizon is what is kept).
	res := commitRes(t, m, req(k, "u", "1", body))
	if res[0].Duplicate {
		t.Fatal("evicted message still deduplicated")
	}
	if b := m.Stats().Bytes; b > budget {
		t.Fatalf("store holds %d bytes, budget %d", b, budget)
	}
}

// Rooms per app: past the bound a new room of that app is refused (publish
// and join alike); its existing rooms and other apps go on.
func TestMemoryRoomsPerApp(t *testing.T) {
	m := NewMemory(10)
	m.SetLimits(0, 3)
	testRoomsPerApp(t, m)
	if got := m.Stats().RoomsRefused; got != 3 {
		t.Fatalf("RoomsRefused = %d, want 3", got)
	}
}

func TestPostgresRoomsPerApp(t *testing.T) {
	st := openTestPG(t, newTestDB(t), PGConfig{MaxAppRooms: 3})
	t.Cleanup(st.Close)
	testRoomsPerApp(t, st)
	if got := st.RoomsRefused(); got < 3 {
		t.Fatalf("RoomsRefused = %d, want at least 3", got)
	}
}

func testRoomsPerApp(t *testing.T, st Store) {
	t.Helper()
	ctx := context.Background()
	// Three rooms of app a, then a batch with a fourth, a known room and
	// another app's room: only the fourth is refused.
	commitRes(t, st, req("a/r1", "u", "1", `1`), req("a/r2", "u", "1", `1`), req("a/r3", "u", "1", `1`))
	res := commitRes(t, st, req("a/r4", "u", "1", `1`), req("a/r1", "u", "2", `2`), req("b/r4", "u", "1", `1`))
	if !errors.Is(res[0].Err, proto.ErrRoomLimit) {
		t.Fatalf("4th room of app a: %+v, want ErrRoomLimit", res[0])
	}
	if res[1].Err != nil || res[1].Seq != 2 {
		t.Fatalf("existing room in the same batch: %+v, want seq 2", res[1])
	}
	if res[2].Err != nil || res[2].Seq != 1 {
		t.Fatalf("other app in the same batch: %+v, want seq 1", res[2])
	}
	if _, err := st.Head(ctx, "a/r5"); !errors.Is(err, proto.ErrRoomLimit) {
		t.Fatalf("Head of a 5th room: %v, want ErrRoomLimit", err)
	}
	if h, err := st.Head(ctx, "a/r2"); err != nil || h.Last != 1 {
		t.Fatalf("Head of an existing room: %+v %v", h, err)
	}
	res = commitRes(t, st, req("a/r6", "u", "1", `1`))
	if !errors.Is(res[0].Err, proto.ErrRoomLimit) {
		t.Fatalf("6th room alone: %+v, want ErrRoomLimit", res[0])
	}
}
