package persist

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// CommitReads stores a batch's rows and its read marks together, on both
// stores; a mark never moves a position back, and a mark of a room never
// published to is dropped.
func TestCommitReads(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) Store{
		"memory":   func(t *testing.T) Store { return NewMemory(100) },
		"postgres": func(t *testing.T) Store { return newPG(t) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			rd := st.(Reads)
			k := proto.RoomKey("app", "r")
			fill(t, st, k, 3)
			rows := []*Row{req(k, "u", "x1", `1`), req(k, "u", "x2", `2`)}
			marks := []ReadMark{{Key: k, User: "alice", Seq: 3}, {Key: k, User: "bob", Seq: 1},
				{Key: proto.RoomKey("app", "never"), User: "alice", Seq: 1}}
			if err := rd.CommitReads(ctx, rows, marks); err != nil {
				t.Fatal(err)
			}
			if rows[0].Seq != 4 || rows[1].Seq != 5 {
				t.Fatalf("rows got seqs %d, %d; want 4, 5", rows[0].Seq, rows[1].Seq)
			}
			if err := rd.CommitReads(ctx, []*Row{req(k, "u", "x3", `3`)}, []ReadMark{{Key: k, User: "alice", Seq: 2}}); err != nil {
				t.Fatal(err)
			}
			for user, want := range map[string]uint64{"alice": 3, "bob": 1, "carol": 0} {
				if got, err := readPosition(ctx, rd, k, user); err != nil || got != want {
					t.Fatalf("%s: position %d, %v; want %d", user, got, err, want)
				}
			}
			if got, err := readPosition(ctx, rd, proto.RoomKey("app", "never"), "alice"); err != nil || got != 0 {
				t.Fatalf("a room never published to: position %d, %v", got, err)
			}
			batch := []ReadMark{{Key: k, User: "bob"}, {Key: proto.RoomKey("app", "never"), User: "alice"},
				{Key: k, User: "carol"}, {Key: k, User: "alice", Seq: 99}, {Key: k, User: "bob"}}
			if err := rd.ReadPositionsOf(ctx, batch); err != nil {
				t.Fatal(err)
			}
			for i, want := range []uint64{1, 0, 0, 3, 1} {
				if batch[i].Seq != want {
					t.Fatalf("positions read together: %d is %d, want %d (%+v)", i, batch[i].Seq, want, batch)
				}
			}
		})
	}
}

// With PostgreSQL the marks are written by the commit's own transaction:
// the position rows carry the messages' transaction id.
func TestCommitReadsOneTransaction(t *testing.T) {
	ctx := context.Background()
	p := newPG(t)
	k := proto.RoomKey("app", "r")
	fill(t, p, k, 2)
	for _, check := range []bool{false, true} {
		if check {
			p.sawStored(time.Now()) // commitSQL's variant too
		}
		id := "t" + map[bool]string{false: "f", true: "c"}[check]
		user := "u-" + id
		if err := p.CommitReads(ctx, []*Row{req(k, "u", id, `1`)}, []ReadMark{{Key: k, User: user, Seq: 2}}); err != nil {
			t.Fatal(err)
		}
		var same bool
		if err := p.pool.QueryRow(ctx, `
SELECT (SELECT xmin::text FROM read_positions WHERE user_id = $1) = (SELECT xmin::text FROM messages WHERE idem_key = $2::bytea)`,
			user, []byte(id)).Scan(&same); err != nil {
			t.Fatal(err)
		}
		if !same {
			t.Fatalf("check %v: the read mark was written by another transaction than the batch's", check)
		}
	}
}

// A room's read positions go with the room.
func TestReadPositionsGoWithRoom(t *testing.T) {
	ctx := context.Background()
	p := newPG(t)
	k := proto.RoomKey("app", "r")
	fill(t, p, k, 2)
	if err := p.SaveReads(ctx, []ReadMark{{Key: k, User: "alice", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, `DELETE FROM messages; DELETE FROM rooms WHERE name = 'r'`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM read_positions`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d read positions left after their room was deleted (%v)", n, err)
	}
}

// Unread on a node that has not seen the rooms yet (its id cache empty:
// another node made them) looks their ids up and answers as for cached
// ones; a room never published to is left out (last and count 0, the
// position as given), wherever it stands among the keys.
func TestPostgresUnreadUncachedRooms(t *testing.T) {
	ctx := context.Background()
	url := newTestDB(t)
	a := openTestPG(t, url, PGConfig{})
	defer a.Close()
	k1, k2 := proto.RoomKey("app", "r1"), proto.RoomKey("app", "r2")
	fill(t, a, k1, 5)
	fill(t, a, k2, 3)
	if err := a.SaveReads(ctx, []ReadMark{{Key: k1, User: "alice", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	b := openTestPG(t, url, PGConfig{})
	defer b.Close()
	keys := []string{proto.RoomKey("app", "never"), k1, proto.RoomKey("app", "never2"), k2}
	for range 2 { // uncached, then cached
		last, read, count := make([]uint64, 4), []uint64{7, 0, 0, 1}, make([]uint64, 4)
		if err := b.Unread(ctx, keys, "alice", last, read, count); err != nil {
			t.Fatal(err)
		}
		want := [3][]uint64{{0, 5, 0, 3}, {7, 2, 0, 1}, {0, 3, 0, 2}}
		if !slices.Equal(last, want[0]) || !slices.Equal(read, want[1]) || !slices.Equal(count, want[2]) {
			t.Fatalf("last %v read %v count %v; want %v", last, read, count, want)
		}
	}
	if _, ok := b.cachedRoom(k2); !ok {
		t.Fatal("the room's id was not cached")
	}
}

// The read marks' CTE takes the parameters after a commit statement's own,
// whatever their number.
func TestWithReadsCTE(t *testing.T) {
	for sql, first := range map[string]string{freshSQL: "$9::int8[]", commitSQL: "$7::int8[]", "WITH a AS (SELECT $12) SELECT $3": "$13::int8[]"} {
		got := withReadsCTE(sql)
		if !strings.HasPrefix(strings.TrimSpace(got), "WITH rd AS (") || !strings.Contains(got, "unnest("+first) {
			t.Fatalf("%q: %s", first, got)
		}
	}
}

// A batch holding a change (a reaction here) commits in its own round
// trips; its read marks are in its transaction too.
func TestCommitReadsWithChange(t *testing.T) {
	ctx := context.Background()
	p := newPG(t)
	k := proto.RoomKey("app", "r")
	fill(t, p, k, 2)
	react := req(k, "bob", "react-1", `"+1"`)
	react.Kind, react.Ref = proto.KindReact, 1
	if err := p.CommitReads(ctx, []*Row{react}, []ReadMark{{Key: k, User: "carol", Seq: 2}}); err != nil || react.Err != nil {
		t.Fatal(err, react.Err)
	}
	var same bool
	if err := p.pool.QueryRow(ctx, `
SELECT (SELECT xmin::text FROM read_positions WHERE user_id = 'carol') = (SELECT xmin::text FROM messages WHERE idem_key = 'react-1'::bytea)`).Scan(&same); err != nil {
		t.Fatal(err)
	}
	if !same {
		t.Fatal("the read mark was written by another transaction than the batch's")
	}
}

// TestPostgresUnreadRoomsWithoutChanges: a room that never had a change is
// counted from its row alone (last_seq, kept_from), so kept_from must say
// what retention removed: rooms trimmed before migration 0014 (kept_from
// 0 with their oldest entries gone) get it from 0015, rooms trimmed since
// from retention itself. Counts match the entries stored after each
// position; a room with a change still counts from its entries.
func TestPostgresUnreadRoomsWithoutChanges(t *testing.T) {
	ctx := context.Background()
	url, conn := olderSchema(t, 14)
	// t: 1-2 removed before 0014, 3-5 kept; e: 1-3 all removed; n: 1-3,
	// never trimmed.
	if _, err := conn.Exec(ctx, `
INSERT INTO apps (id) VALUES ('a');
INSERT INTO rooms (id, app, name, last_seq, msgs) VALUES (1, 'a', 't', 5, 5), (2, 'a', 'e', 3, 3), (3, 'a', 'n', 3, 3);
INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, msgs) VALUES
	(1, 3, 'u', 'k3', now(), '3', 0, 0, 3), (1, 4, 'u', 'k4', now(), '4', 0, 0, 4), (1, 5, 'u', 'k5', now(), '5', 0, 0, 5),
	(3, 1, 'u', 'k1', now(), '1', 0, 0, 1), (3, 2, 'u', 'k2', now(), '2', 0, 0, 2), (3, 3, 'u', 'k3', now(), '3', 0, 0, 3);
SELECT setval(pg_get_serial_sequence('rooms', 'id'), 3)`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	st := openTestPG(t, url, PGConfig{})
	defer st.Close()
	for key, want := range map[string]int64{"t": 3, "e": 4, "n": 0} {
		var from int64
		if err := st.pool.QueryRow(ctx, `SELECT kept_from FROM rooms WHERE app = 'a' AND name = $1`, key).Scan(&from); err != nil || from != want {
			t.Fatalf("room %s: kept_from %d (%v), want %d", key, from, err, want)
		}
	}
	check := func(key string, unread map[uint64]uint64) {
		t.Helper()
		for pos, n := range unread {
			last, read, count := []uint64{0}, []uint64{pos}, []uint64{0}
			if err := st.Unread(ctx, []string{key}, "carol", last, read, count); err != nil || count[0] != n {
				t.Errorf("%s unread after %d: %d (%v), want %d", key, pos, count[0], err, n)
			}
		}
	}
	check("a/t", map[uint64]uint64{0: 3, 1: 3, 2: 3, 3: 2, 4: 1, 5: 0, 9: 0})
	check("a/e", map[uint64]uint64{0: 0, 2: 0, 3: 0})
	check("a/n", map[uint64]uint64{0: 3, 1: 2, 3: 0})

	// Trimmed by retention now: 10 messages, the newest 4 kept.
	for i := range 10 {
		commitRows(t, st, req("b/r", "u", fmt.Sprint("m", i), `0`))
	}
	keep(t, st, "b", 0, 4)
	if _, err := st.EnforceRetention(ctx); err != nil {
		t.Fatal(err)
	}
	check("b/r", map[uint64]uint64{0: 4, 5: 4, 6: 4, 7: 3, 9: 1, 10: 0})
	// A change: the room is counted from its entries from then on, the
	// reaction not among them.
	commitRows(t, st, req("b/r", "u", "m10", `0`), change("b/r", "v", "x", proto.KindReact, 11, `"x"`))
	check("b/r", map[uint64]uint64{0: 5, 6: 5, 10: 1, 11: 0, 12: 0})
}

// readPosition is user's stored position in the room key.
func readPosition(ctx context.Context, rd Reads, key, user string) (uint64, error) {
	m := []ReadMark{{Key: key, User: user}}
	err := rd.ReadPositionsOf(ctx, m)
	return m[0].Seq, err
}
