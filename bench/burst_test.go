//go:build linux

package bench

import (
	"strconv"
	"testing"
	"time"
)

func TestBurstSpreadAndValidate(t *testing.T) {
	p := &params{scenario: "publish", rooms: 7, rate: 100, runID: "x", burst: 100}
	pl := p.buildPlan(2, 0)
	sum, lo, hi := 0, 1<<30, 0
	for _, s := range pl.specs {
		if !s.publish {
			if s.burst != 0 {
				t.Fatalf("a receiver has a burst share %d", s.burst)
			}
			continue
		}
		sum += s.burst
		lo, hi = min(lo, s.burst), max(hi, s.burst)
	}
	if sum != 100 || hi-lo > 1 {
		t.Fatalf("burst spread: sum %d, shares %d..%d", sum, lo, hi)
	}
	for _, tc := range []struct {
		p  params
		ok bool
	}{
		{params{scenario: "publish", burst: 10, burstOver: time.Second, duration: 2 * time.Second}, true},
		{params{scenario: "publish", burst: -1, burstOver: time.Second, duration: 2 * time.Second}, false},
		{params{scenario: "publish", burst: 10, burstOver: time.Second, burstAt: 1500 * time.Millisecond, duration: 2 * time.Second}, false},
		{params{scenario: "publish", burst: 10, burstOver: 0, duration: 2 * time.Second}, false},
		{params{scenario: "publish", burst: 10, burstOver: time.Second, duration: 2 * time.Second, step: true}, false},
		{params{scenario: "density", burst: 10, burstOver: time.Second, duration: 2 * time.Second}, false},
	} {
		if err := tc.p.validateBurst(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.p, err)
		}
	}
	if got := (&params{duration: 10 * time.Second, burstOver: 2 * time.Second}).burstOffset(); got != 4*time.Second {
		t.Errorf("default offset %v, want the window's middle (4s)", got)
	}
}

// The burst is paced over --burst-over, counted apart, and its acks stay
// out of the others' latencies.
func TestBurstPacedAndCountedApart(t *testing.T) {
	l, c := testLoop(t)
	c.spec.burst = 10
	l.pubs = []*conn{c}
	bs := time.Now().UnixNano()
	l.e.burstStart.Store(bs)
	l.e.burstOver.Store(int64(time.Second))
	l.publishBurst(bs+int64(500*time.Millisecond), bs)
	if c.burstSent != 5 || l.st.BurstSent != 5 || l.st.Sent != 5 || l.st.Expected != 5 {
		t.Fatalf("half way: sent %d (stats %d, %d, expected %d)", c.burstSent, l.st.BurstSent, l.st.Sent, l.st.Expected)
	}
	l.publishBurst(bs+int64(2*time.Second), bs)
	l.publishBurst(bs+int64(3*time.Second), bs)
	if c.burstSent != 10 || l.st.BurstSent != 10 {
		t.Fatalf("at the end: sent %d", c.burstSent)
	}
	at := bs + int64(2500*time.Millisecond)
	l.frames(c, appendServerText(nil, []byte(`{"op":"ack","id":"3","room":"r0","seq":3}`)), at)
	if l.st.Acked != 1 || l.st.BurstAcked != 1 || l.st.BurstLastAck != at || l.st.AckLat.n != 0 {
		t.Fatalf("acked %d, burst acked %d at %d, ack latencies %d", l.st.Acked, l.st.BurstAcked, l.st.BurstLastAck, l.st.AckLat.n)
	}
	l.appendPub(c, at) // an ordinary publish: its ack is timed
	l.frames(c, appendServerText(nil, []byte(`{"op":"ack","id":"11","room":"r0","seq":11}`)), at+1000)
	if l.st.AckLat.n != 1 || l.st.BurstAcked != 1 {
		t.Fatalf("ordinary ack: latencies %d, burst acked %d", l.st.AckLat.n, l.st.BurstAcked)
	}
}

// A burst through a real node: every publish of it acked, the backlog's
// end and the others' latencies meanwhile reported.
func TestPublishBurst(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "publish", "--url", n.url, "--rooms=20", "--rate=200", "--burst=1000",
		"--burst-at=500ms", "--burst-over=500ms", "--series=100ms", "--verdict", "--drain=20s", "--pid", strconv.Itoa(n.pid))
	b := rep.Burst
	if b == nil || b.Offered != 1000 || b.Sent != 1000 || b.Acked != 1000 || b.BacklogGoneS <= 0 || b.During == nil {
		t.Fatalf("burst %+v", b)
	}
	if b.Before == nil || b.Before.Acked == 0 || b.Before.AckP95 <= 0 {
		t.Errorf("no steady window before the burst: %+v", b.Before)
	}
	if b.During.Acked == 0 || b.During.AckP99 <= 0 {
		t.Errorf("no others' acks during the burst: %+v", b.During)
	}
	if rep.Verdict == nil || !rep.Verdict.OK {
		t.Fatalf("verdict %+v", rep.Verdict)
	}
	r := rep.Levels[0]
	if r.Acked != r.Sent || r.Sent < 1000 || r.AckLatency.Count != r.Acked-1000 {
		t.Fatalf("sent %d acked %d, ack latencies %d (the burst's 1000 left out)", r.Sent, r.Acked, r.AckLatency.Count)
	}
	checkNodeCounters(t, n, rep)
}
