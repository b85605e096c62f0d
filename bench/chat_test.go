//go:build linux

package bench

import (
	"bytes"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/roost-chat/roost/persist/pgtest"
)

// delivery --signals: every signal reaches every member but its sender,
// nothing is stored or acked, and the node's CPU per frame is reported.
func TestDeliverySignals(t *testing.T) {
	n := startNode(t, "--signal-rate", "0")
	rep := runBench(t, "delivery", "--signals", "--url", n.url, "--members=40", "--publishers=5", "--rate=200",
		"--pid", strconv.Itoa(n.pid))
	r := rep.Levels[0]
	if r.Sent == 0 || r.Acked != 0 {
		t.Fatalf("sent %d signals, %d acked (want none)", r.Sent, r.Acked)
	}
	if r.Expected != r.Sent*44 || r.Delivered != r.Expected {
		t.Errorf("delivered %d of %d expected (sent %d × 44 other members)", r.Delivered, r.Expected, r.Sent)
	}
	if r.Latency.Count != r.Delivered || len(r.Closes) != 0 || len(r.Errors) != 0 {
		t.Errorf("latency count %d, closes %v, errors %v", r.Latency.Count, r.Closes, r.Errors)
	}
	if r.NodeUsPerFrame <= 0 {
		t.Errorf("no node CPU per frame: %+v", r)
	}
	if got := n.metric(t, "roost_publishes_total"); got != 0 {
		t.Errorf("node stored %d publishes for signals", got)
	}
	if got := n.metric(t, "roost_signals_sent_total"); got < r.Delivered {
		t.Errorf("node counts %d signals sent, bench received %d", got, r.Delivered)
	}
}

// reads in its short form, on PostgreSQL: every phase acks its publishes,
// the marks are answered and written, unread requests are answered, and
// the figures are reported.
func TestReads(t *testing.T) {
	n, s := runReadsShort(t)
	for _, want := range []string{"A: publishes: ", "B: publishes + read marks: ", "read marks/s sent", "µs per read mark (net of A)",
		"ack p99 ", "C: publishes + unread: ", "unread of 20 rooms: ", "µs per publish", "bench CPU ",
		"node ack split, ms mean/p99: queue ", " write ", "node unread split, ms mean/p99: positions ", " store ", " inbox "} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(s, "errors:") {
		t.Errorf("errors in the run")
	}
	if got := n.metric(t, "roost_read_marks_written_total"); got == 0 {
		t.Errorf("no read mark written")
	}
}

// reads --join: the markers join their rooms and mark the newest seq they
// received; every mark is answered (none refused: a marker never marks
// past what the node delivered it) and written.
func TestReadsJoin(t *testing.T) {
	db := pgtest.NewDB(t)
	n := startNodeAt(t, "", "", "--database-url", db, "--migrate", "--log-level", "warn")
	var out, errb bytes.Buffer
	code := Main([]string{"reads", "--url", n.url, "--rooms=20", "--users=100", "--pub-rate=200", "--unread-conns=0", "--join",
		"--warmup=1500ms", "--duration=2s"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, errb.String(), out.String())
	}
	s := out.String()
	t.Log(s)
	if !strings.Contains(s, "read marks/s sent") || strings.Contains(s, "errors:") {
		t.Errorf("report lacks its marks or has errors:\n%s", s)
	}
	if got := n.metric(t, "roost_read_marks_written_total"); got == 0 {
		t.Errorf("no read mark written")
	}
	if got := n.metric(t, "roost_read_marks_checked_total"); got != 0 {
		t.Errorf("%d marks looked up in the store, want 0: every marked seq was delivered", got)
	}
}

// runReadsShort runs reads in its short form against a node on a database
// of its own (extra: the node's flags) and returns the node and the report.
func runReadsShort(t *testing.T, extra ...string) (testNode, string) {
	t.Helper()
	db := pgtest.NewDB(t)
	n := startNodeAt(t, "", "", append([]string{"--database-url", db, "--migrate", "--log-level", "warn"}, extra...)...)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Main([]string{"reads", "--url", n.url, "--rooms=20", "--users=100", "--pub-rate=200", "--unread-conns=2", "--unread-rate=10",
		"--unread-rooms=20", "--warmup=1500ms", "--duration=2s", "--pid", strconv.Itoa(n.pid), "--pg-db", strings.TrimPrefix(u.Path, "/"),
		"--admin", n.admin}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, errb.String(), out.String())
	}
	t.Log(errb.String())
	t.Log(out.String())
	return n, out.String()
}

// The askers say nothing through phases A and B, the markers nothing
// through A: longer than twice the node's --idle, after which a node closes
// a connection that did not answer its ping. The bench answers pings as any
// client must, so every connection lives through the run and C's unread
// requests are answered (they were not, at the default --idle of 25 s,
// behind phases of 25 s each).
func TestReadsSilentConnsAnswerPings(t *testing.T) {
	n, s := runReadsShort(t, "--idle", "300ms")
	for _, want := range []string{"unread of 20 rooms: ", "read marks/s sent"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, bad := range []string{"CONNECTIONS LOST", "WRITES FAILED", "unanswered", "NO "} {
		if strings.Contains(s, bad) {
			t.Errorf("report says %q", bad)
		}
	}
	if got := n.metric(t, "roost_read_marks_written_total"); got == 0 {
		t.Errorf("no read mark written")
	}
}
