package persist

import (
	"context"
	"strconv"
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
				if got, err := rd.ReadPosition(ctx, k, user); err != nil || got != want {
					t.Fatalf("%s: position %d, %v; want %d", user, got, err, want)
				}
			}
			if got, err := rd.ReadPosition(ctx, proto.RoomKey("app", "never"), "alice"); err != nil || got != 0 {
				t.Fatalf("a room never published to: position %d, %v", got, err)
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

// BenchmarkPostgresUnread100 is the store's part of an unread request of
// 100 rooms: one query for the rooms' newest seqs and the user's
// positions.
func BenchmarkPostgresUnread100(b *testing.B) {
	ctx := context.Background()
	p := openTestPG(b, newTestDB(b), PGConfig{})
	defer p.Close()
	keys := make([]string, 100)
	var marks []ReadMark
	for i := range keys {
		keys[i] = proto.RoomKey("app", "r"+strconv.Itoa(i))
		if err := p.CommitBatch(ctx, []*Row{req(keys[i], "u", "m", `1`), req(keys[i], "u", "n", `2`)}); err != nil {
			b.Fatal(err)
		}
		marks = append(marks, ReadMark{Key: keys[i], User: "alice", Seq: 1})
	}
	if err := p.SaveReads(ctx, marks); err != nil {
		b.Fatal(err)
	}
	last, read, count := make([]uint64, 100), make([]uint64, 100), make([]uint64, 100)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(read)
		if err := p.Unread(ctx, keys, "alice", last, read, count); err != nil {
			b.Fatal(err)
		}
	}
	if last[99] != 2 || read[99] != 1 || count[99] != 1 {
		b.Fatalf("last %d read %d count %d", last[99], read[99], count[99])
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
