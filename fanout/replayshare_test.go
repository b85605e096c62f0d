package fanout

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

func fillRoom(t *testing.T, st persist.Store, key string, from, n int) {
	t.Helper()
	var rows []*persist.Row
	for i := from; i < from+n; i++ {
		rows = append(rows, &persist.Row{Key: key, From: "u", ID: []byte(fmt.Sprintf("m%d", i)), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if err := st.CommitBatch(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
}

func wantRange(t *testing.T, what string, msgs []proto.Message, lo, hi uint64) {
	t.Helper()
	if uint64(len(msgs)) != hi-lo+1 && !(hi < lo && len(msgs) == 0) {
		t.Fatalf("%s: %d messages, want seqs %d..%d", what, len(msgs), lo, hi)
	}
	for i, m := range msgs {
		if m.Seq != lo+uint64(i) || string(m.Body) != fmt.Sprintf(`{"n":%d}`, m.Seq) {
			t.Fatalf("%s: message %d is seq %d %s, want seq %d", what, i, m.Seq, m.Body, lo+uint64(i))
		}
	}
}

func testReplayShare(t *testing.T, st persist.Store) {
	ctx := context.Background()
	key := proto.RoomKey("a", "storm")
	other := proto.RoomKey("a", "calm")
	fillRoom(t, st, key, 1, 200)
	fillRoom(t, st, other, 1, 5)
	g := NewReplayShare(st, time.Second, 16, 1<<20)

	// a storm: 100 rejoins of one room, since 170..199, all at once and in
	// any order
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func(since uint64) {
			defer wg.Done()
			msgs, more, err := g.Range(ctx, key, since, 200, persist.Bounds{Limit: 500})
			if err != nil || more || len(msgs) != int(200-since) || (len(msgs) > 0 && msgs[0].Seq != since+1) {
				errs <- fmt.Errorf("since %d: %d msgs more %v err %v", since, len(msgs), more, err)
			}
		}(uint64(170 + i%30))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// the first read starts 32 below its since: it serves every other one
	if r := g.Reads(); r != 1 || g.Served() != 100 {
		t.Fatalf("%d store reads for %d rejoins", r, g.Served())
	}
	// one further behind than that replaces the range with a larger one
	msgs, _, _ := g.Range(ctx, key, 100, 200, persist.Bounds{Limit: 500})
	wantRange(t, "further behind", msgs, 101, 200)
	if g.Reads() != 2 {
		t.Fatalf("%d reads", g.Reads())
	}
	before := g.Reads()
	// from the kept range: exact bounds, limits and byte bounds
	msgs, more, _ := g.Range(ctx, key, 150, 160, persist.Bounds{})
	wantRange(t, "150..160", msgs, 151, 160)
	if more {
		t.Fatal("more within upto")
	}
	msgs, more, _ = g.Range(ctx, key, 150, 200, persist.Bounds{Limit: 7})
	wantRange(t, "limit 7", msgs, 151, 157)
	if !more {
		t.Fatal("no more after a limit")
	}
	msgs, more, _ = g.Range(ctx, key, 150, 200, persist.Bounds{MaxBytes: 1})
	wantRange(t, "byte bound", msgs, 151, 151)
	if !more {
		t.Fatal("no more after a byte bound")
	}
	if g.Reads() != before {
		t.Fatalf("kept range read again: %d reads", g.Reads()-before)
	}
	// a message committed since: only the tail is read, then kept
	fillRoom(t, st, key, 201, 3)
	msgs, _, _ = g.Range(ctx, key, 190, 203, persist.Bounds{Limit: 500})
	wantRange(t, "tail", msgs, 191, 203)
	msgs, _, _ = g.Range(ctx, key, 120, 202, persist.Bounds{Limit: 500})
	wantRange(t, "after the tail", msgs, 121, 202)
	if g.Reads() != before+1 {
		t.Fatalf("%d reads for one tail", g.Reads()-before)
	}
	// rooms do not mix; an empty range reads nothing
	msgs, _, _ = g.Range(ctx, other, 0, 5, persist.Bounds{Limit: 500})
	wantRange(t, "other room", msgs, 1, 5)
	if msgs, _, _ := g.Range(ctx, other, 5, 5, persist.Bounds{}); len(msgs) != 0 {
		t.Fatal("empty range")
	}
	// a client far behind is served page by page, each page kept
	big := proto.RoomKey("a", "big")
	for i := 0; i < 12; i++ {
		fillRoom(t, st, big, 1+100*i, 100)
	}
	r0 := g.Reads()
	var got []proto.Message
	for after := uint64(0); after < 1200; {
		msgs, more, err := g.Range(ctx, big, after, 1200, persist.Bounds{Limit: 500})
		if err != nil || len(msgs) == 0 {
			t.Fatalf("page from %d: %d msgs %v", after, len(msgs), err)
		}
		got = append(got, msgs...)
		after = msgs[len(msgs)-1].Seq
		if !more && after != 1200 {
			t.Fatalf("no more at %d", after)
		}
	}
	wantRange(t, "paged", got, 1, 1200)
	if n := g.Reads() - r0; n != 3 {
		t.Fatalf("%d reads for 3 pages", n)
	}
	// the kept range expires
	time.Sleep(1100 * time.Millisecond)
	r0 = g.Reads()
	g.Range(ctx, key, 150, 160, persist.Bounds{})
	if g.Reads() != r0+1 {
		t.Fatal("expired range served")
	}
}

func TestReplayShareMemory(t *testing.T) {
	testReplayShare(t, persist.NewMemory(10000))
}

func TestReplaySharePostgres(t *testing.T) {
	url := pgtest.NewDB(t)
	ctx := context.Background()
	if err := persist.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	p, err := persist.OpenPostgres(ctx, url, persist.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	testReplayShare(t, p)
}

func TestReplayShareBounded(t *testing.T) {
	st := persist.NewMemory(10000)
	ctx := context.Background()
	for r := 0; r < 5; r++ {
		fillRoom(t, st, proto.RoomKey("a", fmt.Sprint("r", r)), 1, 10)
	}
	g := NewReplayShare(st, time.Minute, 3, 1<<20)
	for r := 0; r < 5; r++ {
		g.Range(ctx, proto.RoomKey("a", fmt.Sprint("r", r)), 0, 10, persist.Bounds{})
	}
	if len(g.rooms) != 3 {
		t.Fatalf("%d rooms kept, bound 3", len(g.rooms))
	}
	// a room too big to keep is served and dropped
	g = NewReplayShare(st, time.Minute, 3, 100)
	msgs, _, _ := g.Range(ctx, proto.RoomKey("a", "r0"), 0, 10, persist.Bounds{})
	if len(msgs) != 10 || len(g.rooms) != 0 {
		t.Fatalf("%d msgs, %d rooms kept", len(msgs), len(g.rooms))
	}
}
