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

// TestPostgresNodesShareRoomsWithoutDeadlock: several nodes (one store
// each, one database) make the same rooms at once and then commit batches
// that touch them in different orders, as when every room has members
// publishing on every node. Room creation used an upsert that locked every
// existing room it named, in input order, so nodes starting together
// deadlocked (PostgreSQL breaks a cycle only after deadlock_timeout, 1 s,
// failing one side: "cannot create rooms: overloaded"); this test failed
// with 75 deadlocks (and took 81 s instead of 4) before ensureRooms

// nodeStores opens n stores on one new database, as n nodes sharing it,
// over a rooms table of production size: the planner then updates a
// batch's rooms through index lookups in the batch's own order (on a tiny
// table a sequential scan takes them in one order by chance), which is
// what made commits of different nodes lock shared rooms in opposite
// orders.
func nodeStores(t *testing.T, n int) (string, []*Postgres) {
	t.Helper()
	url := newTestDB(t)
	stores := make([]*Postgres, n)
	for i := range stores {
		stores[i] = openTestPG(t, url, PGConfig{})
		t.Cleanup(stores[i].Close)
	}
	if _, err := stores[0].pool.Exec(context.Background(), `INSERT INTO apps (id) VALUES ('other') ON CONFLICT DO NOTHING;
INSERT INTO rooms (app, name) SELECT 'other', 'r' || g FROM generate_series(1, 20000) g; ANALYZE rooms`); err != nil {
		t.Fatal(err)
	}
	return url, stores
}

// stopped locking existing rows.
func TestPostgresNodesShareRoomsWithoutDeadlock(t *testing.T) {
	const nodes, rooms, batches, perBatch = 4, 40, 80, 30
	url, stores := nodeStores(t, nodes)
	ctx := context.Background()
	// Every node makes (or finds) the rooms at once, in its own order: the
	// room-creation path must not deadlock either. Then every node knows
	// every room, and only the commits' locks are at stake.
	var wg sync.WaitGroup
	for n, st := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			warm := make([]*Row, rooms)
			for i, r := range rand.New(rand.NewPCG(uint64(n), 1)).Perm(rooms) {
				warm[i] = req(proto.RoomKey("app", fmt.Sprint("room", r)), fmt.Sprint("warm", n), "w", `0`)
			}
			commit(t, st, warm...)
		}()
	}
	wg.Wait()
	before := deadlocks(t, url)

	errs := make(chan error, 2*nodes*batches)
	start := time.Now()
	for g := 0; g < 2*nodes; g++ {
		n := g % nodes // two committers per node, as the pool's spread makes
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for b := 0; b < batches; b++ {
				reqs := make([]*Row, perBatch)
				res := make([]Stored, perBatch)
				for i, r := range rng.Perm(rooms)[:perBatch] {
					reqs[i] = req(proto.RoomKey("app", fmt.Sprint("room", r)), fmt.Sprint("node", g), fmt.Sprintf("b%d-%d", b, i), `1`)
				}
				if err := commitInto(ctx, stores[n], reqs, res); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("CommitBatch: %v", err)
	}
	// The statistics reach pg_stat_database when a backend reports them
	// (about once a second, and when it exits).
	for _, st := range stores {
		st.pool.Reset()
	}
	var got int64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = deadlocks(t, url) - before; got > 0 {
			break
		}
	}
	if got > 0 {
		t.Errorf("%d deadlocks among %d batches of %d nodes sharing %d rooms (took %v)", got, 2*nodes*batches, nodes, rooms, time.Since(start))
	}
	// Every seq of every room is dense: no batch was lost or doubled.
	for r := 0; r < rooms; r++ {
		key := proto.RoomKey("app", fmt.Sprint("room", r))
		last, err := stores[0].LastSeq(ctx, key)
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

func deadlocks(t *testing.T, url string) int64 {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int64
	if err := c.QueryRow(context.Background(), `SELECT pg_stat_force_next_flush(); SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		// pg_stat_force_next_flush is PostgreSQL 15+; older servers report
		// on their own schedule.
		if err := c.QueryRow(context.Background(), `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	return n
}
