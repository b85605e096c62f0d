//go:build linux

package bench

import (
	"math"
	"strings"
	"testing"
)

func mustParseMetrics(t *testing.T, s string) map[string]float64 {
	t.Helper()
	m, err := parseMetrics(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The split of a window is the difference of its two scrapes: counts and
// sums for the mean, buckets for the p99, interpolated in its bucket.
func TestAckSplitLe(t *testing.T) {
	before := mustParseMetrics(t, `# HELP roost_ack_phase_seconds x
# TYPE roost_ack_phase_seconds histogram
roost_ack_phase_seconds_bucket{phase="commit",le="0.001"} 10
roost_ack_phase_seconds_bucket{phase="commit",le="0.002"} 10
roost_ack_phase_seconds_bucket{phase="commit",le="0.004"} 10
roost_ack_phase_seconds_bucket{phase="commit",le="+Inf"} 10
roost_ack_phase_seconds_sum{phase="commit"} 0.005
roost_ack_phase_seconds_count{phase="commit"} 10
roost_read_marks_written_total 3
`)
	// the window: 100 commits, 90 under 1 ms, 8 in 1-2 ms, 2 in 2-4 ms
	after := mustParseMetrics(t, `roost_ack_phase_seconds_bucket{phase="commit",le="0.001"} 100
roost_ack_phase_seconds_bucket{phase="commit",le="0.002"} 108
roost_ack_phase_seconds_bucket{phase="commit",le="0.004"} 110
roost_ack_phase_seconds_bucket{phase="commit",le="+Inf"} 110
roost_ack_phase_seconds_sum{phase="commit"} 0.105
roost_ack_phase_seconds_count{phase="commit"} 110
roost_ack_phase_seconds_bucket{phase="write",le="0.001"} 0
roost_ack_phase_seconds_bucket{phase="write",le="+Inf"} 4
roost_ack_phase_seconds_sum{phase="write"} 0.02
roost_ack_phase_seconds_count{phase="write"} 4
roost_read_marks_written_total 7
`)
	if after["roost_read_marks_written_total"] != 7 {
		t.Fatalf("counter: %v", after)
	}
	split, err := ackSplit(before, after)
	if err != nil {
		t.Fatal(err)
	}
	if len(split) != 2 || split[0].phase != "commit" || split[1].phase != "write" {
		t.Fatalf("phases %+v", split)
	}
	c := split[0]
	// p99 is the 99th of 100: 1 into the 2-4 ms bucket of 2
	if c.count != 100 || !near(c.mean, 0.001) || !c.p99OK || c.p99Above || !near(c.p99, 0.003) {
		t.Fatalf("commit %+v", c)
	}
	// every write past the last finite bound: 1 ms and above
	if w := split[1]; w.count != 4 || !near(w.mean, 0.005) || !w.p99Above || !near(w.p99, 0.001) {
		t.Fatalf("write %+v", w)
	}
	if got, want := fmtAckSplit(split), "commit 1.00/3.00 write 5.00/>1 (100 acks)"; got != want {
		t.Fatalf("line %q, want %q", got, want)
	}
}

// The unread split reads its own family, in the order a request passes
// the phases, and says it in requests.
func TestUnreadSplit(t *testing.T) {
	before := mustParseMetrics(t, `roost_unread_phase_seconds_bucket{phase="store",le="0.001"} 0
roost_unread_phase_seconds_bucket{phase="store",le="0.002"} 0
roost_unread_phase_seconds_bucket{phase="store",le="+Inf"} 0
roost_unread_phase_seconds_sum{phase="store"} 0
roost_unread_phase_seconds_count{phase="store"} 0
roost_unread_phase_seconds_bucket{phase="positions",le="0.001"} 0
roost_unread_phase_seconds_bucket{phase="positions",le="+Inf"} 0
roost_unread_phase_seconds_sum{phase="positions"} 0
roost_unread_phase_seconds_count{phase="positions"} 0
roost_ack_phase_seconds_bucket{phase="commit",le="+Inf"} 0
roost_ack_phase_seconds_sum{phase="commit"} 0
roost_ack_phase_seconds_count{phase="commit"} 0
`)
	after := mustParseMetrics(t, `roost_unread_phase_seconds_bucket{phase="store",le="0.001"} 50
roost_unread_phase_seconds_bucket{phase="store",le="0.002"} 100
roost_unread_phase_seconds_bucket{phase="store",le="+Inf"} 100
roost_unread_phase_seconds_sum{phase="store"} 0.1
roost_unread_phase_seconds_count{phase="store"} 100
roost_unread_phase_seconds_bucket{phase="positions",le="0.001"} 100
roost_unread_phase_seconds_bucket{phase="positions",le="+Inf"} 100
roost_unread_phase_seconds_sum{phase="positions"} 0.02
roost_unread_phase_seconds_count{phase="positions"} 100
roost_ack_phase_seconds_bucket{phase="commit",le="+Inf"} 7
roost_ack_phase_seconds_sum{phase="commit"} 7
roost_ack_phase_seconds_count{phase="commit"} 7
`)
	split, err := unreadSplit(before, after)
	if err != nil {
		t.Fatal(err)
	}
	// p99 of the store: the 99th of 100, 49 of 50 into the 1-2 ms bucket
	if got, want := fmtSplit(split, "requests"), "positions 0.20/0.99 store 1.00/1.98 (100 requests)"; got != want {
		t.Fatalf("line %q, want %q", got, want)
	}
	if _, err := unreadSplit(before, mustParseMetrics(t, "roost_acks_total 5\n")); err == nil || !strings.Contains(err.Error(), "no roost_unread_phase_seconds") {
		t.Fatalf("a node without it: err %v", err)
	}
}

// A node without the histogram (an older version) is said, not a zero.
func TestAckSplitMissing(t *testing.T) {
	m := mustParseMetrics(t, "roost_acks_total 5\n")
	if _, err := ackSplit(m, m); err == nil || !strings.Contains(err.Error(), "no roost_ack_phase_seconds") {
		t.Fatalf("err %v", err)
	}
}

// Lost connections, failed writes and unanswered requests are lines of the
// report, and a healthy run has none.
func TestReadsProblems(t *testing.T) {
	p := &readsParams{unreadRooms: 100}
	ok := &readsResult{conns: [nRoles]int{10, 100, 20}, asked: 2000}
	ok.unread.Count = 2000
	if got := ok.problems(p); len(got) != 0 {
		t.Fatalf("healthy run: %q", got)
	}
	bad := &readsResult{conns: [nRoles]int{10, 100, 20}, lost: [nRoles]int{0, 0, 20}, lostFirst: `q0: closed by the node (1000 "")`,
		writeErrs: [nRoles]uint64{0, 0, 7}, asked: 20, unanswered: 20, askBusy: 1900, askLost: 5}
	got := strings.Join(bad.problems(p), "\n")
	for _, want := range []string{`CONNECTIONS LOST: 20 of 20 unread askers (first: q0: closed by the node (1000 "")`,
		"WRITES FAILED: 7 by unread askers", "unread of 100 rooms: 20 requests sent in the window, 0 answered, 0 answered err, 20 unanswered",
		"1900 turns skipped", "5 turns skipped in the window, the asker's connection lost"} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	none := &readsResult{conns: [nRoles]int{10, 0, 2}}
	if got := strings.Join(none.problems(p), "\n"); !strings.Contains(got, "NO request sent") {
		t.Errorf("no requests: %q", got)
	}
}
