package persist

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/proto"
)

// listedFrom is the room's listed_from, 0 for NULL, and the seqs of its
// messages that messages_listed holds.
func listedFrom(t *testing.T, st *Postgres, key string) (uint64, []uint64) {
	t.Helper()
	ctx := context.Background()
	id, ok, err := st.roomID(ctx, key)
	if err != nil || !ok {
		t.Fatalf("room %s: %v %v", key, ok, err)
	}
	var from *int64
	if err := st.pool.QueryRow(ctx, `SELECT listed_from FROM rooms WHERE id = $1`, id).Scan(&from); err != nil {
		t.Fatal(err)
	}
	rows, err := st.pool.Query(ctx, `SELECT seq FROM messages WHERE room_id = $1 AND kind = 0 AND msgs <> seq ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	listed := []uint64{}
	for _, s := range seqs {
		listed = append(listed, uint64(s))
	}
	if from == nil {
		return 0, listed
	}
	return uint64(*from), listed
}

// TestPostgresListedFrom: a room's plain messages stay out of
// messages_listed until its first change, whose seq becomes the room's
// listed_from; from it on every message is in it. A room with no change
// of its own in a batch holding changes stays out.
func TestPostgresListedFrom(t *testing.T) {
	st := newPG(t)
	const key, plain = "a/c", "a/p"
	for i := range 5 {
		commitRows(t, st, req(key, "alice", fmt.Sprint("m", i), `1`))
	}
	commitRows(t, st, req(plain, "bob", "p1", `1`))
	rows := []*Row{
		req(key, "alice", "m5", `6`),
		req(plain, "bob", "p2", `2`),
		change(key, "bob", "r1", proto.KindReact, 2, `"👍"`),
		req(key, "alice", "m6", `8`),
	}
	commitRows(t, st, rows...)
	for _, r := range rows {
		wantNew(t, r)
	}
	if rows[2].Seq != 7 {
		t.Fatalf("the change's seq %d, want 7", rows[2].Seq)
	}
	if from, listed := listedFrom(t, st, key); from != 7 || !reflect.DeepEqual(listed, []uint64{8}) {
		t.Fatalf("after the first change: listed_from %d, listed %v; want 7, [8]", from, listed)
	}
	if from, listed := listedFrom(t, st, plain); from != 0 || len(listed) != 0 {
		t.Fatalf("room with no change: listed_from %d, listed %v", from, listed)
	}
	commitRows(t, st, change(key, "alice", "e1", proto.KindEdit, 8, `"e"`), req(key, "alice", "m7", `10`))
	commitRows(t, st, req(key, "alice", "m8", `11`))
	if from, listed := listedFrom(t, st, key); from != 7 || !reflect.DeepEqual(listed, []uint64{8, 10, 11}) {
		t.Fatalf("after more: listed_from %d, listed %v; want 7, [8 10 11]", from, listed)
	}
	msgs, more, err := st.Fold(context.Background(), key, FoldQuery{Before: 11}, Bounds{Limit: 7})
	if err != nil || !more || !reflect.DeepEqual(foldedSeqs(msgs), []uint64{2, 3, 4, 5, 6, 8, 10}) {
		t.Fatalf("fold: %v more %v, %v", foldedSeqs(msgs), more, err)
	}
}

// TestPostgresFoldPlan: a folded page merges the two ordered scans
// (messages before listed_from by the primary key, after it by
// messages_listed) under its limit, so it reads only what the page takes,
// whatever the statistics say.
func TestPostgresFoldPlan(t *testing.T) {
	st := newPG(t)
	for name, sql := range map[string]string{"fold_back": foldBackSQL, "fold_forward": foldForwardSQL} {
		text := genericPlan(t, st, nil, name, "int8, int8, int8", sql, "1, 100, 51")
		if !strings.Contains(text, "Merge Append") || strings.Contains(text, "Seq Scan on messages") || strings.Contains(text, "  Sort  ") ||
			!strings.Contains(text, "using messages_listed") || !strings.Contains(text, "using messages_pkey") {
			t.Fatalf("%s: the plan does not merge the two index scans:\n%s", name, text)
		}
	}
}

// TestMigrateListedFrom: migration 0013 on a database holding rooms of
// every kind: messages from before 0007 (msgs NULL), a room with no
// change, one with changes, one whose changes retention removed; folded
// history and unread counts are the same after it, and stay right as the
// rooms go on.
func TestMigrateListedFrom(t *testing.T) {
	ctx := context.Background()
	url, conn := olderSchema(t, 12)
	// c: 1-3 before 0007, 4 a message, 5 a react to 2, 6 a message, 7
	// an edit of 4, 8 a message. p: 1-2 before 0007, 3-4 since. g:
	// retention removed 1-3 and, with 2, its change 4; 5-6 are messages.
	if _, err := conn.Exec(ctx, `
INSERT INTO apps (id) VALUES ('a');
INSERT INTO rooms (id, app, name, last_seq, msgs) VALUES (1, 'a', 'c', 8, 6), (2, 'a', 'p', 4, 4), (3, 'a', 'g', 6, 5);
INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, ref, msgs, reaction) VALUES
	(1, 1, 'u', 'k1', now(), '1', 0, 0, NULL, NULL, NULL),
	(1, 2, 'u', 'k2', now(), '2', 0, 0, NULL, NULL, NULL),
	(1, 3, 'u', 'k3', now(), '3', 0, 0, NULL, NULL, NULL),
	(1, 4, 'u', 'k4', now(), '4', 0, 0, NULL, 4, NULL),
	(1, 5, 'v', 'k5', now(), '"x"', 0, 3, 2, 4, 'x'),
	(1, 6, 'u', 'k6', now(), '6', 0, 0, NULL, 5, NULL),
	(1, 7, 'u', 'k7', now(), '"e"', 0, 1, 4, 5, NULL),
	(1, 8, 'u', 'k8', now(), '8', 0, 0, NULL, 6, NULL),
	(2, 1, 'u', 'k1', now(), '1', 0, 0, NULL, NULL, NULL),
	(2, 2, 'u', 'k2', now(), '2', 0, 0, NULL, NULL, NULL),
	(2, 3, 'u', 'k3', now(), '3', 0, 0, NULL, 3, NULL),
	(2, 4, 'u', 'k4', now(), '4', 0, 0, NULL, 4, NULL),
	(3, 5, 'u', 'k5', now(), '5', 0, 0, NULL, 4, NULL),
	(3, 6, 'u', 'k6', now(), '6', 0, 0, NULL, 5, NULL);
INSERT INTO message_state (room_id, seq, edited, body, reactions) VALUES (1, 2, NULL, NULL, '{"x": 1}'), (1, 4, now(), '"e"', '{}');
SELECT setval(pg_get_serial_sequence('rooms', 'id'), 3)`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	st := openTestPG(t, url, PGConfig{})
	defer st.Close()
	for _, c := range []struct {
		key    string
		from   uint64
		listed []uint64
	}{{"a/c", 5, []uint64{6, 8}}, {"a/p", 0, []uint64{}}, {"a/g", 7, []uint64{5, 6}}} {
		if from, listed := listedFrom(t, st, c.key); from != c.from || !reflect.DeepEqual(listed, c.listed) {
			t.Fatalf("%s: listed_from %d, listed %v; want %d, %v", c.key, from, listed, c.from, c.listed)
		}
	}
	check := func(key string, want []uint64, unread map[uint64]uint64) {
		t.Helper()
		for limit := 1; limit <= len(want)+1; limit++ {
			msgs, more, err := st.Fold(ctx, key, FoldQuery{}, Bounds{Limit: limit})
			w := want[max(len(want)-limit, 0):]
			if err != nil || more != (limit < len(want)) || !reflect.DeepEqual(foldedSeqs(msgs), w) {
				t.Fatalf("%s fold %d: %v more %v, %v; want %v", key, limit, foldedSeqs(msgs), more, err, w)
			}
			msgs, more, err = st.Fold(ctx, key, FoldQuery{Forward: true}, Bounds{Limit: limit})
			w = want[:min(limit, len(want))]
			if err != nil || more != (limit < len(want)) || !reflect.DeepEqual(foldedSeqs(msgs), w) {
				t.Fatalf("%s fold forward %d: %v more %v, %v; want %v", key, limit, foldedSeqs(msgs), more, err, w)
			}
		}
		for pos, n := range unread {
			last, read, count := []uint64{0}, []uint64{pos}, []uint64{0}
			if err := st.Unread(ctx, []string{key}, "carol", last, read, count); err != nil || count[0] != n {
				t.Fatalf("%s unread after %d: %d, %v; want %d", key, pos, count[0], err, n)
			}
		}
	}
	check("a/c", []uint64{1, 2, 3, 4, 6, 8}, map[uint64]uint64{0: 6, 2: 4, 4: 2, 5: 2, 7: 1, 8: 0})
	check("a/p", []uint64{1, 2, 3, 4}, map[uint64]uint64{0: 4, 1: 3, 3: 1})
	check("a/g", []uint64{5, 6}, map[uint64]uint64{0: 2, 3: 2, 5: 1})
	// On: a plain message in each, then a change in p.
	for _, k := range []string{"a/c", "a/p", "a/g"} {
		commitRows(t, st, req(k, "u", "n", `"n"`))
	}
	react := change("a/p", "v", "r", proto.KindReact, 5, `"x"`)
	commitRows(t, st, react, req("a/p", "u", "n2", `"n2"`))
	wantNew(t, react)
	if from, listed := listedFrom(t, st, "a/p"); from != 6 || !reflect.DeepEqual(listed, []uint64{7}) {
		t.Fatalf("a/p after its first change: listed_from %d, listed %v", from, listed)
	}
	check("a/c", []uint64{1, 2, 3, 4, 6, 8, 9}, map[uint64]uint64{0: 7, 8: 1, 9: 0})
	check("a/p", []uint64{1, 2, 3, 4, 5, 7}, map[uint64]uint64{0: 6, 4: 2, 5: 1, 6: 1, 7: 0})
	check("a/g", []uint64{5, 6, 7}, map[uint64]uint64{0: 3, 6: 1})
}

// olderSchema is a test database of its own with the migrations up to
// version last applied and recorded as Migrate does, so a test can fill a
// schema of an older release before Migrate brings it up to date; the
// connection is closed when the test ends.
func olderSchema(t *testing.T, last int) (string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	url := newTestDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := conn.Exec(ctx, `CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	ms, _ := migrations()
	for _, m := range ms {
		if m.version > last {
			break
		}
		if _, err := conn.PgConn().Exec(ctx, m.sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
			t.Fatal(err)
		}
	}
	return url, conn
}

// TestPostgresUnreadPlan: the unread query probes the rooms asked by id
// (rooms_pkey: integers compared, not (app, name) by the collation), one
// index lookup each, on the generic plan every store connection runs: the
// other rooms are never read, whatever the costs say. A young database's
// missing statistics made the plain join's generic plan a hash join over
// every room of the app (1,000 in a `roost bench reads` database);
// enable_nestloop off stands for those costs here, and a lateral probe
// has no other plan.
func TestPostgresUnreadPlan(t *testing.T) {
	st := newPG(t)
	if _, err := st.pool.Exec(context.Background(), `
INSERT INTO apps (id) VALUES ('unread-plan');
INSERT INTO rooms (app, name) SELECT 'unread-plan', 'r' || g FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	text := genericPlan(t, st, []string{"enable_nestloop = off"}, "unread_plan", "int8[], text, int8[]", unreadSQL,
		`'{1,2,3}', 'u', '{0,0,0}'`)
	if !strings.Contains(text, "Index Scan using rooms_pkey on rooms") || strings.Contains(text, "rooms_app_name") || strings.Contains(text, "Seq Scan on rooms") ||
		strings.Contains(text, "Bitmap Heap Scan on rooms") || strings.Contains(text, "Seq Scan on messages") ||
		!strings.Contains(text, "Index Scan using read_positions_pkey") || strings.Contains(text, "Heap Scan on read_positions") ||
		strings.Contains(text, "Seq Scan on read_positions") {
		t.Fatalf("the unread plan does not probe the rooms asked:\n%s", text)
	}
}
