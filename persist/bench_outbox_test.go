package persist

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// BenchmarkOutboxVsCursor: what an outbox would cost the database at
// commit, against the cursor (which writes nothing at commit). The outbox
// is the cheapest faithful one: a statement-level trigger on messages
// that records, in the commit's own transaction, one row (room, from seq,
// to seq) per room of each batch, and the rows a delivery would delete
// are deleted every 100 batches (as a delivery writing every 100 ms at
// 1,000 batches a second would). Rounds alternate cursor, outbox, outbox,
// cursor, cursor, outbox; each commits b.N batches of 10 messages, one to
// each of 10 rooms, from one goroutine; the CPU is the database's
// backends' (/proc), charged per publish.
//
//	go test -run XXX -bench OutboxVsCursor -benchtime 2000x ./persist/
func BenchmarkOutboxVsCursor(b *testing.B) {
	url := newTestDB(b)
	st := openTestPG(b, url, PGConfig{MaxConns: 2})
	defer st.Close()
	ctx := context.Background()
	if _, err := st.pool.Exec(ctx, `
CREATE TABLE bench_outbox (id bigserial PRIMARY KEY, room_id bigint NOT NULL, from_seq bigint NOT NULL, to_seq bigint NOT NULL);
CREATE FUNCTION bench_outbox_fill() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO bench_outbox (room_id, from_seq, to_seq) SELECT room_id, min(seq), max(seq) FROM new_rows GROUP BY room_id;
	RETURN NULL;
END $$;
CREATE TRIGGER bench_outbox AFTER INSERT ON messages REFERENCING NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION bench_outbox_fill();`); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = proto.RoomKey("bench", fmt.Sprint("room", i))
	}
	body := []byte(`{"text":"hello, this is a chat message of some length"}`)
	seq := 0
	reqs := make([]*Row, len(keys))
	res := make([]Stored, len(keys))
	round := func(outbox bool) time.Duration {
		mode := "DISABLE"
		if outbox {
			mode = "ENABLE"
		}
		if _, err := st.pool.Exec(ctx, `ALTER TABLE messages `+mode+` TRIGGER bench_outbox`); err != nil {
			b.Fatal(err)
		}
		pids := pgtest.BackendPIDs(b, url)
		cpu0 := pgtest.CPU(pids)
		for i := 0; i < b.N; i++ {
			for k := range reqs {
				seq++
				reqs[k] = &Row{Key: keys[k], From: "u", ID: []byte(fmt.Sprint(seq)), Body: body}
			}
			if err := commitInto(ctx, st, reqs, res); err != nil {
				b.Fatal(err)
			}
			if outbox && i%100 == 99 {
				if _, err := st.pool.Exec(ctx, `DELETE FROM bench_outbox`); err != nil {
					b.Fatal(err)
				}
			}
		}
		return pgtest.CPU(pids) - cpu0
	}
	round(false) // warm: rooms made, statements prepared
	round(true)
	b.ResetTimer()
	var cur, out time.Duration
	for _, outbox := range []bool{false, true, true, false, false, true} {
		d := round(outbox)
		b.Logf("outbox %v: %v of PostgreSQL CPU for %d publishes", outbox, d, b.N*len(keys))
		if outbox {
			out += d
		} else {
			cur += d
		}
	}
	b.StopTimer()
	n := float64(3 * b.N * len(keys))
	b.ReportMetric(float64(cur.Microseconds())/n, "pg-µs/pub-cursor")
	b.ReportMetric(float64(out.Microseconds())/n, "pg-µs/pub-outbox")
	b.ReportMetric(float64(out)/float64(cur), "outbox/cursor")
}
