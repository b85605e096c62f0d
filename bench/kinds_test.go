//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist/pgtest"
)

// runKinds runs `roost bench kinds` and decodes its JSON report.
func runKinds(t *testing.T, args ...string) *KindsReport {
	t.Helper()
	var out, errb bytes.Buffer
	if code := Main(append([]string{"kinds", "--json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("roost bench kinds %v: exit %d\n%s\n%s", args, code, errb.String(), out.String())
	}
	var rep KindsReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("cannot decode report: %v\n%s", err, out.String())
	}
	return &rep
}

// TestKindsReactAndFold: the reaction load through a node with PostgreSQL
// stores every reaction (users react and take it back in turn, never a
// no-op), each acked, the room's folded counts what the model says; the
// fold mode pages through it.
func TestKindsReactAndFold(t *testing.T) {
	db := pgtest.NewDB(t)
	n := startNode(t, "--database-url", db, "--migrate", "--log-level", "warn")
	const users, messages = 20, 5
	// 20 users at 400/s for 1 s: each user reacts to each message twice
	// then takes it back twice; every one stored.
	rep := runKinds(t, "--mode", "react", "--url", n.url, "--room", "hot", "--users", strconv.Itoa(users),
		"--messages", strconv.Itoa(messages), "--rate", "400", "--for", "1s", "--node-pid", strconv.Itoa(n.pid), "--pg-db", dbName(t, db))
	if rep.Sent == 0 || rep.Acked != rep.Sent || rep.Errors != 0 || rep.Latency.Count != uint64(rep.Sent) {
		t.Fatalf("react: %+v", rep)
	}
	if rep.PGUS <= 0 || rep.NodeUS <= 0 {
		t.Errorf("no CPU measured: %+v", rep)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var stored, msgs int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind IN (3, 4)), count(*) FILTER (WHERE kind = 0) FROM messages`).Scan(&stored, &msgs); err != nil {
		t.Fatal(err)
	}
	if stored != rep.Sent || msgs != messages {
		t.Fatalf("%d reactions and %d messages stored, %d sent and %d messages posted", stored, msgs, rep.Sent, messages)
	}
	// The folded page: per message, the users whose last entry is a react.
	var want int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT DISTINCT ON (ref, sender) kind FROM messages WHERE kind IN (3, 4) ORDER BY ref, sender, seq DESC) l WHERE kind = 3`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	var got int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum((reactions->>'👍')::int), 0) FROM message_state`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("state counts %d reactions standing, the log %d", got, want)
	}
	// Plain messages for a room long enough to page, then folded pages.
	runKinds(t, "--mode", "msg", "--url", n.url, "--room", "long", "--users", "5", "--rate", "500", "--for", "1s")
	rep = runKinds(t, "--mode", "fold", "--url", n.url, "--room", "long", "--conns", "2", "--requests", "50", "--limit", "50")
	if rep.Acked != 50 || rep.Errors != 0 || rep.Messages != 50*50 || rep.Latency.Count != 50 {
		t.Fatalf("fold: %+v", rep)
	}
	if code := Main([]string{"kinds", "--mode", "nope"}, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Fatalf("bad mode: exit %d, want 2", code)
	}
}

// dbName is the database of a URL, for --pg-db.
func dbName(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}
