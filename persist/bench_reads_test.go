package persist

import (
	"context"
	"fmt"
	"testing"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// BenchmarkPGCommitReads: PostgreSQL CPU per read mark written in the
// group commit's statement, net of the same commits without marks: 1,000
// rooms, 10,000 users (10 a room), commits of 50 publishes over the rooms
// carrying marks of the users in turn, every mark moving its position.
//
//	go test -run XXX -bench PGCommitReads -benchtime 400x ./persist/
func BenchmarkPGCommitReads(b *testing.B) {
	for _, marks := range []int{0, 100} {
		b.Run(fmt.Sprint("marks-", marks), func(b *testing.B) {
			ctx := context.Background()
			url := newTestDB(b)
			st := openTestPG(b, url, PGConfig{MaxConns: 1})
			defer st.Close()
			const rooms, users, per = 1000, 10000, 50
			body := []byte(`{"text":"a message of some fifty bytes, as chat has"}`)
			key := func(r int) string { return fmt.Sprint("a/r", r) }
			n, u := 0, 0
			seq := make([]uint64, rooms)
			batch := func(marks int) {
				rows := make([]*Row, per)
				for i := range rows {
					r := n % rooms
					n++
					rows[i] = &Row{Key: key(r), From: fmt.Sprint("p", r), ID: []byte(fmt.Sprint(n)), Body: body}
				}
				ms := make([]ReadMark, 0, marks)
				for range marks {
					r := u % rooms
					if seq[r] > 0 {
						ms = append(ms, ReadMark{Key: key(r), User: fmt.Sprint("u", u), Seq: seq[r]})
					}
					u = (u + 1) % users
				}
				if err := st.CommitReads(ctx, rows, ms); err != nil {
					b.Fatal(err)
				}
				for i, r := range rows {
					if r.Err != nil {
						b.Fatalf("row %d: %+v", i, r.Stored)
					}
					seq[(n-per+i)%rooms] = r.Seq
				}
			}
			for range 2 * rooms / per {
				batch(0) // every room stored
			}
			for range users / max(marks, 1) {
				batch(marks) // every user's position stored, then moved
			}
			pgBatches(b, url, 1, "commit", func() { batch(marks) })
		})
	}
}

// BenchmarkPGSaveReads: PostgreSQL CPU per read mark written in batches
// of their own (one SaveReads statement and transaction each, as the
// group commit's marks writer sends them), by batch size: 1,000 rooms,
// 10,000 users (10 a room) marking in turn, every mark moving its
// position.
//
//	go test -run XXX -bench PGSaveReads -benchtime 20x ./persist/
func BenchmarkPGSaveReads(b *testing.B) {
	for _, size := range []int{100, 1000, 4000} {
		b.Run(fmt.Sprint("batch-", size), func(b *testing.B) {
			ctx := context.Background()
			url := newTestDB(b)
			st := openTestPG(b, url, PGConfig{MaxConns: 1})
			defer st.Close()
			const rooms, users = 1000, 10000
			key := func(r int) string { return fmt.Sprint("a/r", r) }
			rows := make([]*Row, rooms)
			for r := range rows {
				rows[r] = &Row{Key: key(r), From: "p", ID: []byte(fmt.Sprint(r)), Body: []byte(`1`)}
			}
			if err := st.CommitBatch(ctx, rows); err != nil {
				b.Fatal(err)
			}
			u, seq := 0, uint64(1)
			batch := func() {
				ms := make([]ReadMark, size)
				for i := range ms {
					ms[i] = ReadMark{Key: key(u % rooms), User: fmt.Sprint("u", u), Seq: seq}
					if u++; u == users {
						u, seq = 0, seq+1
					}
				}
				if err := st.SaveReads(ctx, ms); err != nil {
					b.Fatal(err)
				}
			}
			for range 2 * users / size {
				batch() // every user's position stored, then moved
			}
			pgBatches(b, url, size, "mark", batch)
		})
	}
}

// pgBatches runs batch b.N times and reports the database's backends' CPU
// per unit (per units a batch) and the wall time per batch.
func pgBatches(b *testing.B, url string, per int, unit string, batch func()) {
	b.Helper()
	pids := pgtest.BackendPIDs(b, url)
	cpu0 := pgtest.CPU(pids)
	b.ResetTimer()
	for range b.N {
		batch()
	}
	b.StopTimer()
	cpu := pgtest.CPU(pids) - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*per), "pg-µs/"+unit)
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/batch")
}

// BenchmarkPGUnread100: PostgreSQL CPU per unread request of 100 rooms
// (one Unread), the rooms spread over an app of 1,000 with 20 entries
// each, asked by a user with a position in every room (read) or in none
// (none: `roost bench reads --users 0`'s askers); changed: the rooms of a
// second app, each with a reaction after its 20 messages, which are
// counted from their entries (rooms without a change from their row
// alone), asked with a position in every room. The room ids are cached,
// as on a node that has asked or published there before.
//
//	go test -run XXX -bench PGUnread100 -benchtime 2000x ./persist/
func BenchmarkPGUnread100(b *testing.B) {
	ctx := context.Background()
	url := newTestDB(b)
	st := openTestPG(b, url, PGConfig{MaxConns: 1})
	defer st.Close()
	const rooms, entries = 1000, 20
	key := func(r int) string { return fmt.Sprint("a/r", r) }
	changed := func(r int) string { return fmt.Sprint("c/r", r) }
	for _, room := range []func(int) string{key, changed} {
		for e := range entries {
			rows := make([]*Row, rooms)
			for r := range rows {
				rows[r] = &Row{Key: room(r), From: "p", ID: []byte(fmt.Sprint(e)), Body: []byte(`{"text":"hi"}`)}
			}
			if err := st.CommitBatch(ctx, rows); err != nil {
				b.Fatal(err)
			}
		}
	}
	reacts := make([]*Row, rooms)
	for r := range reacts {
		reacts[r] = &Row{Key: changed(r), From: "q", ID: []byte("x"), Kind: proto.KindReact, Ref: 1, Body: []byte(`"x"`)}
	}
	if err := st.CommitBatch(ctx, reacts); err != nil {
		b.Fatal(err)
	}
	marks := make([]ReadMark, 0, 2*rooms)
	for r := range rooms {
		marks = append(marks, ReadMark{Key: key(r), User: "reader", Seq: entries / 2}, ReadMark{Key: changed(r), User: "reader", Seq: entries / 2})
	}
	if err := st.SaveReads(ctx, marks); err != nil {
		b.Fatal(err)
	}
	keys, changedKeys := make([]string, 100), make([]string, 100)
	for i := range keys {
		keys[i], changedKeys[i] = key(i*rooms/len(keys)), changed(i*rooms/len(keys))
	}
	for _, c := range []struct {
		name, user string
		keys       []string
		last, want uint64 // each room's newest seq and unread count
	}{{"read", "reader", keys, entries, entries / 2}, {"none", "none", keys, entries, entries}, {"changed", "reader", changedKeys, entries + 1, entries / 2}} {
		b.Run(c.name, func(b *testing.B) {
			keys := c.keys
			last, read, count := make([]uint64, len(keys)), make([]uint64, len(keys)), make([]uint64, len(keys))
			pgBatches(b, url, 1, "unread", func() {
				clear(read)
				if err := st.Unread(ctx, keys, c.user, last, read, count); err != nil {
					b.Fatal(err)
				}
				if last[99] != c.last || count[99] != c.want {
					b.Fatalf("last %d read %d count %d", last[99], read[99], count[99])
				}
			})
		})
	}
}
