package persist

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

func newTestDB(tb testing.TB) string { return pgtest.NewDB(tb) }

func openTestPG(tb testing.TB, url string, cfg PGConfig) *Postgres {
	tb.Helper()
	ctx := context.Background()
	if err := Migrate(ctx, url); err != nil {
		tb.Fatal(err)
	}
	p, err := OpenPostgres(ctx, url, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func newPG(t *testing.T) *Postgres {
	p := openTestPG(t, newTestDB(t), PGConfig{})
	t.Cleanup(p.Close)
	return p
}

func TestPostgresContract(t *testing.T) {
	testStoreContract(t, func(t *testing.T) Store { return newPG(t) })
}

func TestMigrate(t *testing.T) {
	ctx := context.Background()
	url := newTestDB(t)
	p, err := OpenPostgres(ctx, url, PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if ok, err := p.SchemaCurrent(ctx); err != nil || ok {
		t.Fatalf("empty database: current %v, %v", ok, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- Migrate(ctx, url) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := p.SchemaCurrent(ctx); err != nil || !ok {
		t.Fatalf("after Migrate: current %v, %v", ok, err)
	}
	var n int
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	// Versions may skip numbers (branches take numbers apart): one row per file.
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("schema_migrations rows %d, %v", n, err)
	}
}

// keep registers app with its own retention (0: no bound of that kind),
// as `roost app` does with the registry in PostgreSQL.
func keep(t *testing.T, st *Postgres, app string, age time.Duration, count int) {
	t.Helper()
	a := proto.App{ID: app, Secret: "secret-of-" + app + "-0123456789", KeepAge: proto.Duration(age), KeepCount: count}
	if err := st.CreateApp(context.Background(), a); err != nil {
		t.Fatal(err)
	}
}

func TestPostgresRetention(t *testing.T) {
	ctx := context.Background()
	st := newPG(t)
	k1, k2 := proto.RoomKey("counted", "r"), proto.RoomKey("aged", "r")
	fill(t, st, k1, 2500)
	fill(t, st, k2, 10)
	keep(t, st, "counted", 0, 100)
	keep(t, st, "aged", time.Hour, 0)
	// Age the first 4 messages of k2.
	if _, err := st.pool.Exec(ctx, `UPDATE messages SET ts = ts - interval '2 hours'
WHERE room_id = (SELECT id FROM rooms WHERE app = 'aged') AND seq <= 4`); err != nil {
		t.Fatal(err)
	}
	n, err := st.EnforceRetention(ctx)
	if err != nil || n != 2400+4 {
		t.Fatalf("EnforceRetention = %d, %v; want 2404", n, err)
	}
	msgs, _, _ := st.History(ctx, k1, 0, Bounds{Limit: 1000})
	wantSeqs(t, "counted", msgs, 2401, 2500)
	msgs, _, _ = st.Range(ctx, k2, 0, 100, Bounds{Limit: 100})
	wantSeqs(t, "aged", msgs, 5, 10)
	// Retention keeps publishing going: seqs continue.
	if res := commit(t, st, req(k1, "u", "new", `1`)); res[0].Seq != 2501 {
		t.Fatalf("after retention: %+v", res[0])
	}
	st.StartRetention(ctx, 10*time.Millisecond)
	st.Close() // stops the job
}

// TestPostgresResolveInDoubt drives the resolution of a commit whose
// connection died during COMMIT, for each possible outcome.
func TestPostgresResolveInDoubt(t *testing.T) {
	ctx := context.Background()
	st := newPG(t)
	k := proto.RoomKey("app", "r")
	commit(t, st, req(k, "u", "old", `0`))
	cause := errors.New("connection reset during COMMIT")

	run := func(reqs []*Row, token int64, execute bool) ([]Stored, error) {
		s := st.scratchPool.Get().(*pgScratch)
		s.reset(len(reqs))
		if err := st.prepare(ctx, s, reqs); err != nil {
			t.Fatal(err)
		}
		if execute {
			conn, err := st.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.runCommit(ctx, conn, commitSQL, s, reqs, token); err != nil {
				t.Fatal(err)
			}
			conn.Release()
		}
		for _, r := range reqs {
			r.Stored = Stored{} // the answer was lost with the connection
		}
		err := st.resolve(s, reqs, token, cause)
		return stored(reqs), err
	}

	// Committed: new messages are answered as new (they get delivered),
	// the old key and the in-batch repeat as duplicates.
	res, err := run([]*Row{req(k, "u", "a", `1`), req(k, "u", "old", `x`), req(k, "u", "a", `1`), req(k, "u", "b", `2`)}, 42, true)
	if err != nil {
		t.Fatalf("committed batch: %v", err)
	}
	want := []Stored{{Seq: 2}, {Seq: 1, Duplicate: true}, {Seq: 2, Duplicate: true}, {Seq: 3}}
	for i := range want {
		if res[i].Seq != want[i].Seq || res[i].Duplicate != want[i].Duplicate || res[i].TS == 0 {
			t.Fatalf("committed: res[%d] = %+v, want %+v", i, res[i], want[i])
		}
	}
	// Rolled back: nothing stored, overloaded.
	_, err = run([]*Row{req(k, "u", "c", `3`), req(k, "u", "a", `1`)}, 43, false)
	if !errors.Is(err, proto.ErrOverloaded) && !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("rolled back batch: %v", err)
	}
	// Every key stored before: duplicates, whatever the outcome.
	res, err = run([]*Row{req(k, "u", "a", `1`), req(k, "u", "b", `2`)}, 44, false)
	if err != nil || !res[0].Duplicate || res[0].Seq != 2 || !res[1].Duplicate || res[1].Seq != 3 {
		t.Fatalf("all-duplicate batch: %+v, %v", res, err)
	}
	if last, _ := st.LastSeq(ctx, k); last != 3 {
		t.Fatalf("LastSeq = %d, want 3", last)
	}
}

// genericPlan is the plan PostgreSQL runs for sql on the store's
// connections (plan_cache_mode force_generic_plan), with the session
// settings given, as EXPLAIN prints it: sql prepared as name(types) and
// executed with args.
func genericPlan(t *testing.T, st *Postgres, settings []string, name, types, sql, args string) string {
	t.Helper()
	ctx := context.Background()
	c, err := st.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	for _, set := range append([]string{"plan_cache_mode = force_generic_plan"}, settings...) {
		if _, err := c.Exec(ctx, `SET `+set); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Exec(ctx, `RESET ALL`) //nolint:errcheck
	if _, err := c.Exec(ctx, `PREPARE `+name+`(`+types+`) AS `+sql); err != nil {
		t.Fatal(err)
	}
	defer c.Exec(ctx, `DEALLOCATE `+name) //nolint:errcheck
	rows, err := c.Query(ctx, `EXPLAIN EXECUTE `+name+`(`+args+`)`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestPostgresCommitPlan guards the generic plan of the commit statement:
// planned on an empty table, it must still probe messages by index, or the
// cost per publish grows with the room's size.
func TestPostgresCommitPlan(t *testing.T) {
	st := newPG(t)
	text := genericPlan(t, st, nil, "commit_plan", "int8[], text[], bytea[], bytea[], int4[], int8", commitSQL, `'{1}', '{u}', '{"\\x41"}', '{"\\x42"}', '{0}', 1`)
	if strings.Contains(text, "Seq Scan on messages") || !strings.Contains(text, "Index Scan using messages_room_id_sender_idem_key_key") {
		t.Fatalf("generic commit plan does not probe messages by index:\n%s", text)
	}
	// The rooms are locked by one LockRows, in id order, before the
	// update (see commitSQL): nodes sharing rooms must not deadlock.
	if i := strings.Index(text, "CTE locked"); i < 0 || !strings.HasPrefix(strings.TrimSpace(text[i+len("CTE locked"):]), "->  LockRows") {
		t.Fatalf("generic commit plan does not lock the rooms first:\n%s", text)
	}
	// freshSQL's update locks the rooms in the order of its list (id
	// order): a nested loop over the list, probing rooms by its key.
	fresh := genericPlan(t, st, nil, "fresh_plan", "int8[], text[], bytea[], bytea[], int8[], int8[], int8[], int8", freshSQL,
		`'{1}', '{u}', '{"\\x41"}', '{"\\x42"}', '{1}', '{1}', '{1}', 1`)
	upd := fresh[strings.Index(fresh, "CTE upd"):strings.Index(fresh, "CTE ins")]
	if strings.Contains(fresh, "Seq Scan") || !regexp.MustCompile(`Nested Loop\s+.*\n\s+->  Function Scan on (?:unnest )?c .*\n\s+->  Index Scan using rooms_pkey on rooms r`).MatchString(upd) {
		t.Fatalf("generic fresh commit plan does not update the rooms in the order of its list:\n%s", fresh)
	}
}

// TestPostgresStoredKeyAfterFreshCommits: batches are committed without
// looking their keys up (freshSQL) until one meets a stored key; that
// batch is rolled back and sent again looking them up, so the stored key
// is answered as a duplicate with its seq, the batch's other publishes
// get the next seqs without a gap, and the batches right after it look
// their keys up too.
func TestPostgresStoredKeyAfterFreshCommits(t *testing.T) {
	ctx := context.Background()
	st := newPG(t)
	k, k2 := proto.RoomKey("app", "r"), proto.RoomKey("app", "r2")
	first := commit(t, st, req(k, "u", "a", `1`), req(k, "u", "b", `2`), req(k2, "u", "a", `1`))
	if st.commitStatement(time.Now()) != freshSQL || st.CommitStats().Rechecks != 0 {
		t.Fatalf("fresh batch: rechecks %d, statement with lookups %v", st.CommitStats().Rechecks, st.commitStatement(time.Now()) == commitSQL)
	}
	// b again, between new publishes of both rooms.
	before := time.Now()
	res := commit(t, st, req(k, "u", "c", `3`), req(k, "u", "b", `x`), req(k2, "u", "b", `2`), req(k, "u", "d", `4`))
	want := []Stored{{Seq: 3}, {Seq: first[1].Seq, TS: first[1].TS, Duplicate: true}, {Seq: 2}, {Seq: 4}}
	for i, w := range want {
		if res[i].Seq != w.Seq || res[i].Duplicate != w.Duplicate || (w.TS != 0 && res[i].TS != w.TS) {
			t.Fatalf("res[%d] = %+v, want %+v", i, res[i], w)
		}
	}
	if n := st.CommitStats().Rechecks; n != 1 {
		t.Fatalf("rechecks = %d, want 1", n)
	}
	// The clock is not the test's: what the hold covers is checked at
	// times of its own, and the next batch is made to fall inside it.
	until := time.Unix(0, st.checkUntil.Load())
	if until.Before(before.Add(recheckFor)) || st.commitStatement(until.Add(-time.Millisecond)) != commitSQL {
		t.Fatalf("the batches after a stored key do not look their keys up for %v (until %v, met after %v)", recheckFor, until, before)
	}
	if st.commitStatement(until) != freshSQL {
		t.Fatal("batches still look their keys up after recheckFor")
	}
	// While batches look keys up, a stored key costs no second statement.
	st.checkUntil.Store(time.Now().Add(time.Hour).UnixNano())
	res = commit(t, st, req(k, "u", "a", `1`), req(k, "u", "e", `5`))
	if !res[0].Duplicate || res[0].Seq != first[0].Seq || res[1].Duplicate || res[1].Seq != 5 {
		t.Fatalf("while looking up: %+v", res)
	}
	if n := st.CommitStats().Rechecks; n != 1 {
		t.Fatalf("rechecks = %d, want still 1", n)
	}
	msgs, _, err := st.Range(ctx, k, 0, 100, Bounds{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "room", msgs, 1, 5)
	if last, _ := st.LastSeq(ctx, k2); last != 2 {
		t.Fatalf("LastSeq(r2) = %d, want 2", last)
	}
	// Once recheckFor has passed, a stored key meets freshSQL again.
	st.checkUntil.Store(0)
	res = commit(t, st, req(k2, "u", "a", `1`))
	if !res[0].Duplicate || res[0].Seq != 1 || st.CommitStats().Rechecks != 2 {
		t.Fatalf("after the hold: %+v, rechecks %d", res[0], st.CommitStats().Rechecks)
	}
}

// TestPostgresRetentionPolicy: the operator's policy (flags) comes first
// for the apps it names, then an app's own limits in the database, then
// the policy's default; the stats count what each rule removed.
func TestPostgresRetentionPolicy(t *testing.T) {
	ctx := context.Background()
	st := newPG(t)
	named, stored, def := proto.RoomKey("named", "r"), proto.RoomKey("stored", "r"), proto.RoomKey("def", "r")
	for _, k := range []string{named, stored, def} {
		fill(t, st, k, 30)
	}
	keep(t, st, "named", 0, 5) // overridden by the policy
	keep(t, st, "stored", 0, 10)
	st.SetRetentionPolicy(RetentionPolicy{
		Default: Retention{MaxCount: 20},
		Apps:    map[string]Retention{"named": {MaxCount: 25}},
	})
	if _, err := st.pool.Exec(ctx, `UPDATE messages SET ts = ts - interval '2 hours'
WHERE room_id = (SELECT id FROM rooms WHERE app = 'def') AND seq <= 12`); err != nil {
		t.Fatal(err)
	}
	n, err := st.EnforceRetention(ctx)
	if err != nil || n != 5+20+10 {
		t.Fatalf("EnforceRetention = %d, %v; want 35", n, err)
	}
	for k, lo := range map[string]uint64{named: 6, stored: 21, def: 11} {
		msgs, _, _ := st.Range(ctx, k, 0, 100, Bounds{Limit: 100})
		wantSeqs(t, k, msgs, lo, 30)
	}
	st.SetRetentionPolicy(RetentionPolicy{Default: Retention{MaxAge: time.Hour}})
	// def loses 11 and 12 to age; named, no longer in the policy, falls
	// back to its own count of 5.
	if n, err := st.EnforceRetention(ctx); err != nil || n != 2+20 {
		t.Fatalf("EnforceRetention by age = %d, %v; want 22", n, err)
	}
	rs := st.RetentionStats()
	if rs.DeletedByCount != 35+20 || rs.DeletedByAge != 2 || rs.Runs != 2 || rs.Errors != 0 {
		t.Fatalf("stats %+v", rs)
	}
}

// TestPostgresFileRegistryRetention: with the registry in a file, the
// file's retention replaces the apps table's columns (stale or absent: no
// command writes them), below the policy's per-app entries.
func TestPostgresFileRegistryRetention(t *testing.T) {
	ctx := context.Background()
	st := newPG(t)
	file, column, named := proto.RoomKey("file", "r"), proto.RoomKey("column", "r"), proto.RoomKey("named", "r")
	for _, k := range []string{file, column, named} {
		fill(t, st, k, 10)
	}
	keep(t, st, "column", 0, 2) // a column no file registry reads
	st.SetRetentionPolicy(RetentionPolicy{Apps: map[string]Retention{"named": {MaxCount: 8}}})
	st.SetAppRetention(map[string]Retention{"file": {MaxCount: 3}, "named": {MaxCount: 1}})
	if n, err := st.EnforceRetention(ctx); err != nil || n != 7+2 {
		t.Fatalf("EnforceRetention = %d, %v; want 9", n, err)
	}
	for k, lo := range map[string]uint64{file: 8, column: 1, named: 3} {
		msgs, _, _ := st.Range(ctx, k, 0, 100, Bounds{Limit: 100})
		wantSeqs(t, k, msgs, lo, 10)
	}
}

// TestPostgresEpoch: a room's epoch exists before its first message,
// survives a restart, and a room deleted and made again gets a new one.
func TestPostgresEpoch(t *testing.T) {
	ctx := context.Background()
	url := newTestDB(t)
	st := openTestPG(t, url, PGConfig{})
	k := proto.RoomKey("app", "r")
	h0, err := st.Head(ctx, k)
	if err != nil || h0.Last != 0 || h0.Epoch == "" || len(h0.Epoch) > MaxEpoch {
		t.Fatalf("Head = %+v, %v", h0, err)
	}
	fill(t, st, k, 3)
	st.Close()
	st = openTestPG(t, url, PGConfig{})
	defer st.Close()
	if h, err := st.Head(ctx, k); err != nil || h.Last != 3 || h.Epoch != h0.Epoch {
		t.Fatalf("after restart: %+v, %v; want last 3 epoch %q", h, err, h0.Epoch)
	}
	if _, err := st.pool.Exec(ctx, `DELETE FROM messages WHERE room_id = (SELECT id FROM rooms WHERE name = 'r');
DELETE FROM rooms WHERE name = 'r'`); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTestPG(t, url, PGConfig{})
	defer st.Close()
	h, err := st.Head(ctx, k)
	if err != nil || h.Last != 0 || h.Epoch == h0.Epoch {
		t.Fatalf("made again: %+v, %v; want a new epoch", h, err)
	}
}

// TestMigrateEpochOfExistingRooms: rooms made before the epoch column get
// one each.
func TestMigrateEpochOfExistingRooms(t *testing.T) {
	ctx := context.Background()
	url, conn := olderSchema(t, 1)
	if _, err := conn.Exec(ctx, `INSERT INTO apps (id) VALUES ('a');
INSERT INTO rooms (app, name, last_seq) VALUES ('a', 'x', 7), ('a', 'y', 0)`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	var n, distinct int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT epoch) FROM rooms WHERE epoch <> ''`).Scan(&n, &distinct); err != nil || n != 2 || distinct != 2 {
		t.Fatalf("epochs of existing rooms: %d rows, %d distinct, %v", n, distinct, err)
	}
}
