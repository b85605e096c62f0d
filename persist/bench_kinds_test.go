package persist

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// BenchmarkPGCommitKinds: PostgreSQL CPU per row of batches of 50 in one
// hot room, as 5,000 publishes a second gather them (a 10 ms window):
// plain messages (set-based statements), the same without messages_listed
// (since 0013 it holds no message of a room that never had a change, as
// here: the two should match), and reactions
// (runChanges: from what the store knows of the room after the first
// batches, one round trip), each user
// reacting and taking it back in turn so that every row is stored.
//
//	go test -run XXX -bench PGCommitKinds -benchtime 200x ./persist/
func BenchmarkPGCommitKinds(b *testing.B) {
	for _, mode := range []string{"msg", "msg-without-listed-index", "react"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			url := newTestDB(b)
			st := openTestPG(b, url, PGConfig{MaxConns: 1})
			defer st.Close()
			if mode == "msg-without-listed-index" {
				if _, err := st.pool.Exec(ctx, `DROP INDEX messages_listed`); err != nil {
					b.Fatal(err)
				}
			}
			const key, per = "a/hot", 50
			body := []byte(`{"text":"a message of some fifty bytes, as chat has"}`)
			seed := make([]*Row, 10)
			for i := range seed {
				seed[i] = &Row{Key: key, From: "author", ID: []byte(fmt.Sprint("seed", i)), Body: body}
			}
			if err := st.CommitBatch(ctx, seed); err != nil {
				b.Fatal(err)
			}
			n := 0
			batch := func() {
				rows := make([]*Row, per)
				for i := range rows {
					m := n
					n++
					r := &Row{Key: key, From: fmt.Sprint("u", m%500), ID: []byte(fmt.Sprint(n)), Body: body}
					if mode == "react" {
						r.Kind, r.Ref, r.Body = proto.KindReact, uint64(1+m%10), []byte(`"👍"`)
						if (m/500)%2 == 1 { // each user on its message: react, then take it back
							r.Kind = proto.KindUnreact
						}
					}
					rows[i] = r
				}
				if err := st.CommitBatch(ctx, rows); err != nil {
					b.Fatal(err)
				}
				for _, r := range rows {
					if r.Err != nil || r.Duplicate {
						b.Fatalf("row %s: %+v", r.ID, r.Stored)
					}
				}
			}
			for range 20 {
				batch() // warm: statements prepared, the backend's caches filled
			}
			pgBatches(b, url, per, "row", batch)
		})
	}
}

// BenchmarkPGFold: a folded page of 50 messages, at a random place of a
// room of 1,000,000 entries (one message, then three reactions to it, in
// turn; every message with a state row), read through the store: the
// latency of each read, p50 and p99.
//
//	go test -run XXX -bench PGFold -benchtime 2000x ./persist/
func BenchmarkPGFold(b *testing.B) {
	ctx := context.Background()
	url := newTestDB(b)
	st := openTestPG(b, url, PGConfig{StatementTimeout: 10 * time.Minute})
	defer st.Close()
	const key, entries = "a/big", 1000000
	if err := st.CommitBatch(ctx, []*Row{{Key: key, From: "u", ID: []byte("first"), Body: []byte(`1`)}}); err != nil {
		b.Fatal(err)
	}
	id, _, err := st.roomID(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for _, sql := range []string{
		`INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, ref, msgs)
		SELECT $1, g, 'u' || (g % 97), convert_to('k' || g, 'UTF8'), now(), convert_to('{"text":"message ' || g || '"}', 'UTF8'), 0,
			CASE WHEN g % 4 = 1 THEN 0 ELSE 3 END, CASE WHEN g % 4 = 1 THEN NULL ELSE g - (g - 1) % 4 END, (g + 3) / 4
		FROM generate_series(2, ` + fmt.Sprint(entries) + `) g`,
		`INSERT INTO message_state (room_id, seq, edited, body, reactions)
		SELECT $1, g, CASE WHEN g % 8 = 1 THEN now() END, CASE WHEN g % 8 = 1 THEN convert_to('"edited"', 'UTF8') END, '{"👍": 2, "🎉": 1}'
		FROM generate_series(5, ` + fmt.Sprint(entries) + `, 4) g`,
		`UPDATE rooms SET last_seq = ` + fmt.Sprint(entries) + `, msgs = ` + fmt.Sprint(entries/4) + `, listed_from = 2 WHERE id = $1`,
		`ANALYZE messages`, `ANALYZE message_state`,
	} {
		args := []any{id}
		if sql[0] == 'A' {
			args = nil
		}
		if _, err := st.pool.Exec(ctx, sql, args...); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("room of %d entries made in %v", entries, time.Since(start))
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		before := uint64(1000 + (i*7919)%(entries-1000))
		t0 := time.Now()
		msgs, more, err := st.Fold(ctx, key, FoldQuery{Before: before}, Bounds{Limit: 50, MaxBytes: 1 << 20})
		lat = append(lat, time.Since(t0))
		if err != nil || len(msgs) != 50 || !more || msgs[0].Reactions == nil {
			b.Fatalf("page before %d: %d messages, more %v, %v", before, len(msgs), more, err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
