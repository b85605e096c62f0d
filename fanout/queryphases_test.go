package fanout

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/fanout/hist"
	"github.com/roost-chat/roost/persist"
)

// phaseOf reads one phase's count and sum (seconds) from a family's
// exposition, as a scrape would.
func phaseOf(t *testing.T, f *hist.Family, phase string) (uint64, float64) {
	t.Helper()
	var b bytes.Buffer
	f.Write(&b)
	var n uint64
	var sum float64
	for _, line := range strings.Split(b.String(), "\n") {
		series, v, ok := strings.Cut(line, " ")
		if !ok || !strings.HasSuffix(series, `{phase="`+phase+`"}`) {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(line, err)
		}
		switch {
		case strings.Contains(series, "_count{"):
			n = uint64(x)
		case strings.Contains(series, "_sum{"):
			sum = x
		}
	}
	return n, sum
}

// An unread request and a receipts query whose store read is held show
// that time in their store phase, and a request queued behind the held
// one in its queue phase: the split says where a client's wait goes (the
// node exposed none of it before).
func TestQueryPhasesShowTheStoreRead(t *testing.T) {
	const hold = 60 * time.Millisecond
	st := &slowReads{Memory: persist.NewMemory(0), in: make(chan struct{}, 2), gate: make(chan struct{})}
	n, l := receiptsNode(t, st)
	commit(t, st.Memory, "test/r", 9)
	tb := n.tables[0].Load()
	var asker, next Member
	if !tb.Unread(&asker, "test", "x", []string{"r"}) {
		t.Fatal("unread refused")
	}
	<-st.in
	// x's next request waits for the same worker.
	if !tb.Unread(&next, "test", "x", []string{"r"}) {
		t.Fatal("unread refused")
	}
	time.Sleep(hold)
	close(st.gate)
	waitEvent(t, l, "x's second unread answer", func(ev *Event) bool { return ev.kind == evReadDone && ev.member == &next })
	ev := waitEvent(t, l, "x's unread answer", func(ev *Event) bool { return ev.kind == evReadDone && ev.member == &asker })
	if ev.err != nil || ev.cursor == 0 {
		t.Fatalf("answer: err %v, posted at %d", ev.err, ev.cursor)
	}
	checkSplit(t, "unread", n.hists.unreadPhases, 2, map[string]time.Duration{"store": hold, "queue": hold})
	checkInbox(t, "unread", tb, &ev, n.hists.unreadPhases)

	// The receipts workers' read, on a store of its own.
	sp := &slowPositions{Memory: persist.NewMemory(0), in: make(chan struct{}, 1), gate: make(chan struct{})}
	n2, l2 := receiptsNode(t, sp)
	commit(t, sp.Memory, "test/r", 9)
	tb2 := n2.tables[0].Load()
	if !tb2.Receipts(&asker, "test/r") {
		t.Fatal("receipts refused")
	}
	<-sp.in
	time.Sleep(hold)
	close(sp.gate)
	ev = waitEvent(t, l2, "the receipts answer", func(ev *Event) bool { return ev.kind == evReadDone && ev.member == &asker })
	if ev.err != nil || ev.cursor == 0 {
		t.Fatalf("answer: err %v, posted at %d", ev.err, ev.cursor)
	}
	checkSplit(t, "receipts", n2.hists.rcptPhases, 1, map[string]time.Duration{"store": hold})
	checkInbox(t, "receipts", tb2, &ev, n2.hists.rcptPhases)
}

// checkSplit checks the split of n queries: each phase of want summing to
// about its time, the others to well under the least of them.
func checkSplit(t *testing.T, what string, f *hist.Family, n uint64, want map[string]time.Duration) {
	t.Helper()
	// The answer is seen as soon as it is posted; its observations follow.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, _ := phaseOf(t, f, "answer"); c == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	least := time.Hour
	for _, d := range want {
		least = min(least, d)
	}
	for _, ph := range []string{"positions", "queue", "store", "answer"} {
		c, s := phaseOf(t, f, ph)
		if c != n {
			t.Fatalf("%s %s: %d observations, want %d", what, ph, c, n)
		}
		d := time.Duration(s * 1e9)
		if w, ok := want[ph]; ok {
			if d < w || d > w+40*time.Millisecond {
				t.Errorf("%s %s phase %v, want about %v", what, ph, d, w)
			}
		} else if d > least/2 {
			t.Errorf("%s %s phase %v: a held read shows there", what, ph, d)
		}
	}
	if c, _ := phaseOf(t, f, "inbox"); c != 0 {
		t.Errorf("%s inbox: %d observations with no loop running the answer", what, c)
	}
}

// checkInbox runs the answer on its loop a while after it was posted: the
// wait shows in the inbox phase.
func checkInbox(t *testing.T, what string, tb *Table, ev *Event, f *hist.Family) {
	t.Helper()
	const wait = 20 * time.Millisecond
	time.Sleep(wait)
	tb.Run(ev)
	c, s := phaseOf(t, f, "inbox")
	if d := time.Duration(s * 1e9); c != 1 || d < wait {
		t.Errorf("%s inbox: %d observations, %v; the answer waited %v", what, c, d, wait)
	}
	if len(ev.member.Out.Pending()) == 0 {
		t.Errorf("%s: the loop wrote no answer", what)
	}
}
