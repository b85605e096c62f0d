package fanout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// The publish pool over the real PostgreSQL store: exactly once through
// retries, restarts and killed backends, and a refused publish failing
// alone.

// openPG migrates the database at url and opens a store on it.
func openPG(tb testing.TB, url string, cfg persist.PGConfig) *persist.Postgres {
	tb.Helper()
	ctx := context.Background()
	if err := persist.Migrate(ctx, url); err != nil {
		tb.Fatal(err)
	}
	p, err := persist.OpenPostgres(ctx, url, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// publisher drives a pool the way the loop does: it retries a publish
// until it is acknowledged (overloaded answers and full queues are
// retried with the same key) and records every outcome.
type publisher struct {
	p     *pool
	mu    sync.Mutex
	acks  map[string]persist.Stored // key|from|id → acknowledged result
	fails map[string]int            // key|from|id → error answers
	bad   []string
	wait  map[*PubRequest]chan persist.Stored
	errs  atomic.Int64
}

func newPublisher() *publisher {
	return &publisher{acks: map[string]persist.Stored{}, fails: map[string]int{}, wait: map[*PubRequest]chan persist.Stored{}}
}

func (pb *publisher) committed(batch []*PubRequest) {
	for _, req := range batch {
		pb.one(req)
	}
}

func (pb *publisher) one(req *PubRequest) {
	res := &req.Stored
	pb.mu.Lock()
	id := req.Key + "|" + req.From + "|" + string(req.ID)
	if res.Err != nil {
		pb.fails[id]++
		pb.errs.Add(1)
	} else if prev, ok := pb.acks[id]; ok {
		if prev.Seq != res.Seq || !res.Duplicate {
			pb.bad = append(pb.bad, fmt.Sprintf("%s: acked seq %d then %+v", id, prev.Seq, *res))
		}
	} else {
		pb.acks[id] = persist.Stored{Seq: res.Seq, TS: res.TS, Duplicate: res.Duplicate}
	}
	ch := pb.wait[req]
	delete(pb.wait, req)
	pb.mu.Unlock()
	ch <- *res
}

// publish submits until acknowledged and returns the result.
func (pb *publisher) publish(key, from, id, body string) persist.Stored {
	for {
		r := newReq(key, from, id, body)
		ch := make(chan persist.Stored, 1)
		pb.mu.Lock()
		pb.wait[r] = ch
		pb.mu.Unlock()
		if err := pb.p.submit(r); err != nil {
			pb.mu.Lock()
			delete(pb.wait, r)
			pb.mu.Unlock()
			if errors.Is(err, proto.ErrClosed) {
				return persist.Stored{Err: err}
			}
			time.Sleep(time.Millisecond)
			continue
		}
		res := <-ch
		if res.Err == nil {
			return res
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkRows compares the messages table with the acknowledgements: per
// room seqs 1..N without gap or duplicate, every ack's row present with its
// seq, no row without an ack.
func checkRows(t *testing.T, url string, pb *publisher) {
	t.Helper()
	ctx := context.Background()
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	rows, err := db.Query(ctx, `
SELECT r.app || '/' || r.name, m.sender, m.idem_key, m.seq, r.last_seq
FROM messages m JOIN rooms r ON r.id = m.room_id ORDER BY r.id, m.seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	next := map[string]uint64{}
	last := map[string]uint64{}
	seen := 0
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if len(pb.bad) > 0 {
		t.Fatalf("%d bad acks, first: %s", len(pb.bad), pb.bad[0])
	}
	for rows.Next() {
		var key, from string
		var idem []byte
		var seq, lastSeq int64
		if err := rows.Scan(&key, &from, &idem, &seq, &lastSeq); err != nil {
			t.Fatal(err)
		}
		next[key]++
		last[key] = uint64(lastSeq)
		if uint64(seq) != next[key] {
			t.Fatalf("%s: seq %d where %d was expected (gap or duplicate)", key, seq, next[key])
		}
		id := key + "|" + from + "|" + string(idem)
		ack, ok := pb.acks[id]
		if !ok {
			t.Fatalf("row %s seq %d was never acknowledged", id, seq)
		}
		if ack.Seq != uint64(seq) {
			t.Fatalf("row %s seq %d, acknowledged %d", id, seq, ack.Seq)
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, n := range next {
		if last[key] != n {
			t.Fatalf("%s: last_seq %d, %d rows", key, last[key], n)
		}
	}
	if seen != len(pb.acks) {
		have := map[string]bool{}
		rows.Close()
		rows2, _ := db.Query(ctx, `SELECT r.app || '/' || r.name || '|' || m.sender || '|' || convert_from(m.idem_key, 'UTF8') || ' ' || m.seq FROM messages m JOIN rooms r ON r.id = m.room_id`)
		for rows2.Next() {
			var s string
			rows2.Scan(&s)
			have[s] = true
		}
		rows2.Close()
		for id, a := range pb.acks {
			if !have[fmt.Sprintf("%s %d", id, a.Seq)] {
				t.Logf("missing %s %+v", id, a)
			}
		}
		t.Fatalf("%d rows, %d acknowledged keys", seen, len(pb.acks))
	}
}

func TestPostgresExactlyOnceConcurrent(t *testing.T) {
	url := pgtest.NewDB(t)
	st := openPG(t, url, persist.PGConfig{})
	defer st.Close()
	pb := newPublisher()
	pb.p = newPool(st, pb.committed, PoolConfig{Workers: 3, MaxBatch: 64})
	const rooms, per, goroutines = 5, 60, 6
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				// Goroutines share keys pairwise: every key is published
				// twice, concurrently, like a client retrying on a new
				// connection.
				for r := 0; r < rooms; r++ {
					key := proto.RoomKey("app", fmt.Sprint("room", r))
					pb.publish(key, fmt.Sprint("user", g/2), fmt.Sprint("m", i), fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))
				}
			}
		}()
	}
	wg.Wait()
	pb.p.close()
	checkRows(t, url, pb)
	if len(pb.acks) != rooms*per*goroutines/2 {
		t.Fatalf("%d acknowledged keys, want %d", len(pb.acks), rooms*per*goroutines/2)
	}
}

func TestPostgresRestart(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDB(t)
	st := openPG(t, url, persist.PGConfig{})
	pb := newPublisher()
	pb.p = newPool(st, pb.committed, PoolConfig{Workers: 2})
	var wg sync.WaitGroup
	var stop atomic.Bool
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				res := pb.publish(proto.RoomKey("app", fmt.Sprint("r", g%2)), fmt.Sprint("u", g), fmt.Sprint(i), `"x"`)
				if res.Err != nil {
					return // the pool closed under us
				}
			}
		}()
	}
	for pb.errs.Load() == 0 && func() bool { pb.mu.Lock(); defer pb.mu.Unlock(); return len(pb.acks) < 300 }() {
		time.Sleep(time.Millisecond)
	}
	// Stop the node mid-stream: publishes in flight are committed and
	// answered by Close, later ones are refused.
	pb.p.close()
	st.Close()
	stop.Store(true)
	wg.Wait()

	st2 := openPG(t, url, persist.PGConfig{})
	defer st2.Close()
	checkRows(t, url, pb)
	pb.mu.Lock()
	acks := make(map[string]persist.Stored, len(pb.acks))
	for k, v := range pb.acks {
		acks[k] = v
	}
	pb.mu.Unlock()
	var rows []*persist.Row
	var want []persist.Stored
	for id, ack := range acks {
		parts := strings.SplitN(id, "|", 3)
		rows = append(rows, &persist.Row{Key: parts[0], From: parts[1], ID: []byte(parts[2]), Body: []byte(`"again"`)})
		want = append(want, ack)
	}
	if err := st2.CommitBatch(ctx, rows); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		if !r.Duplicate || r.Seq != want[i].Seq || r.TS != want[i].TS {
			t.Fatalf("re-publish after restart: %+v, want duplicate of %+v", r.Stored, want[i])
		}
	}
}

// TestPostgresTerminateBackends kills the store's connections during a
// publish burst: the pool recovers by itself, no acknowledged message is
// lost, no failed publish left a row (checkRows: every row was
// acknowledged by a later retry of its key, with the stored seq).
func TestPostgresTerminateBackends(t *testing.T) {
	url := pgtest.NewDB(t)
	st := openPG(t, url, persist.PGConfig{MaxConns: 6})
	defer st.Close()
	pb := newPublisher()
	pb.p = newPool(st, pb.committed, PoolConfig{Workers: 3, MaxBatch: 32})
	const rooms, per = 6, 150
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				pb.publish(proto.RoomKey("app", fmt.Sprint("r", g%rooms)), fmt.Sprint("u", g), fmt.Sprint(i), fmt.Sprint(i))
			}
		}()
	}
	killed := 0
	for round := 0; round < 8; round++ {
		time.Sleep(15 * time.Millisecond)
		killed += pgtest.Terminate(t, url)
	}
	wg.Wait()
	pb.p.close()
	if killed == 0 {
		t.Fatal("no backend was terminated")
	}
	cs := st.CommitStats()
	t.Logf("terminated %d backends; %d error answers retried; in-doubt commits: %d committed, %d rolled back, %d unresolved",
		killed, pb.errs.Load(), cs.ResolvedCommitted, cs.ResolvedRolledBack, cs.Unresolved)
	checkRows(t, url, pb)
	if len(pb.acks) != 6*per {
		t.Fatalf("%d acknowledged, want %d", len(pb.acks), 6*per)
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A batch holding publishes that PostgreSQL refuses (a NUL or invalid
// UTF-8 in the sender, a NUL in a new room's name) commits everybody
// else's: only the bad requests fail, each logged with the reason, and the
// others keep their order and consecutive seqs.
func TestPoolSplitsBatchAroundRefusedPublish(t *testing.T) {
	st := openPG(t, pgtest.NewDB(t), persist.PGConfig{})
	defer st.Close()
	sink := newAckSink()
	var logs lockedBuf
	p := newPool(st, sink.committed, PoolConfig{Workers: 1, MaxBatch: 300, Window: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	bad := map[int]*PubRequest{
		17:  newReq("app/r1", "ev\x00il", "b1", `1`),
		150: newReq("app/r2", "bad\xffutf8", "b2", `2`),
		299: newReq("app/ro\x00om", "u", "b3", `3`),
	}
	for i := 0; i < 300; i++ {
		req := bad[i]
		if req == nil {
			req = newReq(fmt.Sprintf("app/r%d", i%3), fmt.Sprintf("user%d", i%7), fmt.Sprint("m", i), fmt.Sprintf(`{"i":%d}`, i))
		}
		if err := p.submit(req); err != nil {
			t.Fatal(err)
		}
	}
	p.close()
	sink.check(t)
	if sink.errs != 3 {
		t.Errorf("%d publishes failed, want the 3 bad ones", sink.errs)
	}
	if got := len(sink.acks); got != 297 {
		t.Errorf("%d publishes stored, want 297", got)
	}
	for _, id := range []string{"app/r1|ev\x00il|b1", "app/r2|bad\xffutf8|b2", "app/ro\x00om|u|b3"} {
		if _, ok := sink.acks[id]; ok {
			t.Errorf("bad publish %q acknowledged", id)
		}
	}
	var n int
	for r := 0; r < 3; r++ {
		last := sink.lastNew[fmt.Sprintf("app/r%d", r)]
		n += int(last)
	}
	if n != 297 {
		t.Errorf("rooms' newest seqs sum to %d, want 297 (consecutive, nothing lost)", n)
	}
	if s := p.stats(); s.Refused != 3 {
		t.Errorf("Stats().Refused = %d, want 3", s.Refused)
	}
	if l := logs.String(); !strings.Contains(l, "the store refused a publish") || !strings.Contains(l, `from="ev\x00il"`) || !strings.Contains(l, "SQLSTATE 22021") {
		t.Errorf("refusal not logged with the sender and reason:\n%s", l)
	}
}
