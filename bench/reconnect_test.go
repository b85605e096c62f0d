//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist/pgtest"
)

// markEvent appends one --events line.
func markEvent(t *testing.T, path, name string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "%d %s\n", time.Now().UnixNano(), name)
	f.Close()
}

// storedCounts reads what the database holds: messages, and rooms whose
// seqs are not 1..count.
func storedCounts(t *testing.T, dbURL string) (msgs int64, holey int64) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if err := c.QueryRow(ctx, `SELECT count(*) FROM messages`).Scan(&msgs); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `SELECT count(*) FROM (SELECT room_id FROM messages GROUP BY room_id HAVING max(seq) <> count(*)) x`).Scan(&holey); err != nil {
		t.Fatal(err)
	}
	return msgs, holey
}

// The node is SIGKILLed in the middle of the window and started again on
// the same port and database: every connection comes back after its
// jittered retry, rejoins with since, and the publishers send their
// unacked publishes again. Nothing acked is lost, nothing is delivered or
// stored twice.
func TestReconnectAfterKill(t *testing.T) {
	db := pgtest.NewDB(t)
	extra := []string{"--database-url", db, "--migrate", "--log-level", "warn"}
	n := startNodeAt(t, "", "", extra...)
	dir := t.TempDir()
	events, pidFile := filepath.Join(dir, "events"), filepath.Join(dir, "pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(n.pid)), 0o644)
	plot := filepath.Join(dir, "series.svg")

	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := Main([]string{"chat", "--url", n.url, "--rooms=6", "--room-size=10", "--active=0.3", "--interval=200ms",
			"--sizes=100:9,2048:1", "--reconnect=same", "--retry-min=300ms", "--retry-max=1s",
			"--series=250ms", "--events", events, "--pid", "node=@" + pidFile, "--rss-tail=2s", "--plot", plot,
			"--warmup=1s", "--duration=6s", "--drain=5s", "--json"}, &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()
	time.Sleep(2500 * time.Millisecond)
	markEvent(t, events, "node SIGKILL")
	n.node.Kill()
	time.Sleep(400 * time.Millisecond)
	n2 := startNodeAt(t, n.node.Addr, n.admin, extra...)
	os.WriteFile(pidFile, []byte(strconv.Itoa(n2.pid)), 0o644)
	markEvent(t, events, "node started")

	res := <-done
	var rep Report
	if err := json.Unmarshal([]byte(res.out), &rep); err != nil {
		t.Fatalf("exit %d: %v\n%s\n%s", res.code, err, res.err, res.out)
	}
	if res.code != 0 || rep.Verdict == nil || !rep.Verdict.OK {
		t.Fatalf("exit %d verdict %+v\n%s", res.code, rep.Verdict, res.err)
	}
	r := rep.Levels[0]
	t.Logf("sent %d acked %d resent %d delivered %d/%d replayed %d rejoins %d; windows %+v", r.Sent, r.Acked, r.Resent, r.Delivered, r.Expected, r.Replayed, r.Rejoins, rep.Windows)
	if r.Rejoins != 60 || r.Closes[1006] != 60 || r.Away != 0 || r.Unrecov != 0 {
		t.Errorf("rejoins %d closes %v away %d recovered:false %d", r.Rejoins, r.Closes, r.Away, r.Unrecov)
	}
	if r.Replayed == 0 {
		t.Errorf("no catch-up deliveries: the kill came during publishing")
	}
	if r.Delivered != r.Expected || r.Acked != r.Sent || r.Sent == 0 {
		t.Errorf("sent %d acked %d delivered %d of %d", r.Sent, r.Acked, r.Delivered, r.Expected)
	}
	msgs, holey := storedCounts(t, db)
	if uint64(msgs) != rep.TotalSent || holey != 0 {
		t.Errorf("database holds %d messages (%d rooms with holes), the bench published %d distinct ones", msgs, holey, rep.TotalSent)
	}
	// A client may rejoin before "node started" is marked: it reconnects as
	// soon as the new process listens, which is before startNodeAt returns.
	// So the two windows share the 60 rejoins between them.
	if len(rep.Windows) != 2 || rep.Windows[0].Name != "node SIGKILL" || rep.Windows[0].Rejoined+rep.Windows[1].Rejoined != 60 || rep.Windows[1].RejoinMax <= 0 {
		t.Errorf("windows %+v", rep.Windows)
	}
	if len(rep.Series) < 20 || len(rep.SeriesNames) != 1 || len(rep.RSSTail) != 1 || !rep.RSSTail[0].Restarted && rep.RSSTail[0].FirstMiB <= 0 {
		t.Errorf("series %d points, names %v, rss tail %+v", len(rep.Series), rep.SeriesNames, rep.RSSTail)
	}
	if svg, err := os.ReadFile(plot); err != nil || !bytes.Contains(svg, []byte("node SIGKILL")) {
		t.Errorf("plot without the event: %v", err)
	}
}
