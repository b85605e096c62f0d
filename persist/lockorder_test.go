package persist

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/proto"
)

// TestPostgresCommitsLockRoomsInOneOrder: nodes (one store each, one
// database) commit batches of every size over rooms they share, as a chat
// load spread over several nodes does. A batch's UPDATE of rooms used to
// lock its rooms in the order its join and hash aggregate produced them,
// which changes with the number of rooms in the batch, so two nodes'
// batches locked shared rooms in opposite orders and deadlocked: this test
// had 198 deadlocks and 22,413 failed publishes (three deadlocks in a row
// fail a batch) and took 174 s; with the rooms locked in id order, none, in
// under a second of commits.
func TestPostgresCommitsLockRoomsInOneOrder(t *testing.T) {
	const nodes, perNode, rooms, batches = 4, 2, 300, 30
	url, stores := nodeStores(t, nodes)
	ctx := context.Background()
	key := func(r int) string { return proto.RoomKey("app", fmt.Sprint("room", r)) }
	warm := make([]*Row, rooms)
	for r := range warm {
		warm[r] = req(key(r), "warm", "w", `0`)
	}
	for _, st := range stores {
		commit(t, st, warm...) // every node knows every room
	}
	before := deadlocks(t, url)
	retries0 := uint64(0)
	for _, st := range stores {
		retries0 += st.CommitStats().Retries
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed int
	acked := make(map[string]uint64) // room/sender/id -> seq
	start := time.Now()
	for g := 0; g < nodes*perNode; g++ {
		st := stores[g%nodes]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for b := 0; b < batches; b++ {
				// Sizes from 1 to 256 (the pool's MaxBatch): a hash
				// aggregate's table, hence its output order, grows with them.
				n := 1 + rng.IntN(256)
				reqs := make([]*Row, n)
				res := make([]Stored, n)
				for i := range reqs {
					reqs[i] = req(key(rng.IntN(rooms)), fmt.Sprint("node", g), fmt.Sprintf("b%d-%d", b, i), `1`)
				}
				err := commitInto(ctx, st, reqs, res)
				mu.Lock()
				for i, r := range res {
					switch {
					case err != nil && r.Err == nil:
						t.Errorf("batch failed (%v) but request %d has no error", err, i)
					case r.Err != nil:
						failed++
					default:
						acked[reqs[i].Key+"/"+reqs[i].From+"/"+string(reqs[i].ID)] = r.Seq
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, st := range stores {
		st.pool.Reset() // a backend reports its statistics when it exits
	}
	var got int64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = deadlocks(t, url) - before; got > 0 {
			break
		}
	}
	retries := uint64(0)
	for _, st := range stores {
		retries += st.CommitStats().Retries
	}
	t.Logf("%d batches of 1-256 publishes from %d nodes over %d shared rooms in %v: %d deadlocks, %d retried, %d publishes failed",
		nodes*perNode*batches, nodes, rooms, took, got, retries-retries0, failed)
	if got > 0 || failed > 0 {
		t.Errorf("%d deadlocks, %d publishes failed", got, failed)
	}
	// Every acknowledged publish is stored with its seq, and every room's
	// seqs are dense: nothing lost or doubled.
	rows, err := stores[0].pool.Query(ctx, `SELECT r.name, m.sender, m.idem_key, m.seq FROM messages m JOIN rooms r ON r.id = m.room_id WHERE r.app = 'app' AND m.sender <> 'warm'`)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for rows.Next() {
		var name, from string
		var id []byte
		var seq uint64
		if err := rows.Scan(&name, &from, &id, &seq); err != nil {
			t.Fatal(err)
		}
		stored++
		k := proto.RoomKey("app", name) + "/" + from + "/" + string(id)
		if s, ok := acked[k]; ok && s != seq {
			t.Errorf("%s acked with seq %d, stored with %d", k, s, seq)
		}
		delete(acked, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acked) > 0 {
		t.Errorf("%d acknowledged publishes not stored", len(acked))
	}
	for r := 0; r < rooms; r++ {
		last, err := stores[0].LastSeq(ctx, key(r))
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := stores[0].pool.QueryRow(ctx, `SELECT count(*) FROM messages m JOIN rooms r ON r.id = m.room_id WHERE r.app = 'app' AND r.name = $1`, fmt.Sprint("room", r)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if uint64(n) != last {
			t.Errorf("room%d: last seq %d, %d rows", r, last, n)
		}
	}
}

// TestPostgresCommitRetriesDeadlock: a transaction outside the store that
// locks rooms in the opposite order still deadlocks with a commit; the
// commit that PostgreSQL fails is sent again (counted), and its publishes
// are acknowledged only once stored.
func TestPostgresCommitRetriesDeadlock(t *testing.T) {
	url := newTestDB(t)
	st := openTestPG(t, url, PGConfig{})
	t.Cleanup(st.Close)
	ctx := context.Background()
	a, b := proto.RoomKey("app", "a"), proto.RoomKey("app", "b")
	commit(t, st, req(a, "u", "1", `1`))
	commit(t, st, req(b, "u", "2", `1`)) // b's id is above a's
	idA, _ := st.cachedRoom(a)
	idB, _ := st.cachedRoom(b)

	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM rooms WHERE id = $1 FOR UPDATE`, idB); err != nil {
		t.Fatal(err)
	}
	reqs := []*Row{req(a, "u", "3", `2`), req(b, "u", "4", `2`)}
	res := make([]Stored, len(reqs))
	done := make(chan error, 1)
	go func() { done <- commitInto(ctx, st, reqs, res) }()
	// The commit holds a and waits for b; then the other transaction asks
	// for a: a cycle. The commit waited first, so its backend finds the
	// cycle after deadlock_timeout and fails its own statement.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting int
		if err := st.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the commit never waited for the other transaction's lock")
		}
	}
	_, lockErr := tx.Exec(ctx, `SELECT 1 FROM rooms WHERE id = $1 FOR UPDATE`, idA)
	_ = tx.Rollback(ctx)
	if err := <-done; err != nil {
		t.Fatalf("CommitBatch after a deadlock: %v (the other side: %v)", err, lockErr)
	}
	cs := st.CommitStats()
	t.Logf("other transaction: %v; stats %+v", lockErr, cs)
	if lockErr != nil || cs.Deadlocks != 1 || cs.Retries != 1 {
		t.Errorf("stats %+v, want one deadlock and one retry", cs)
	}
	for i, r := range res {
		if r.Err != nil || r.Seq != 2 {
			t.Errorf("res[%d] = %+v, want seq 2", i, r)
		}
	}
	for _, k := range []string{a, b} {
		if last, err := st.LastSeq(ctx, k); err != nil || last != 2 {
			t.Errorf("%s: last seq %d (%v), want 2", k, last, err)
		}
	}
}
