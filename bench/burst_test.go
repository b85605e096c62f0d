//go:build linux

package bench

import (
	"bytes"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/gobwas/ws"
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

// --read-marks: a receiver answers each fresh message with a read mark of
// its seq; the node's read answers are counted, not taken for errors.
func TestReadMarkSent(t *testing.T) {
	l, c := testLoop(t)
	l.e.readMarks = true
	c.spec.publish = false
	now := time.Now().UnixNano()
	l.frames(c, serverStream(1, 2, now-1000), now)
	if l.st.ReadMarks != 2 {
		t.Fatalf("read marks %d, out %d bytes", l.st.ReadMarks, len(c.out))
	}
	f, err := readClientFrames(c.out)
	if err != nil || len(f) != 2 || f[0] != `{"op":"read","room":"r0","seq":1}` || f[1] != `{"op":"read","room":"r0","seq":2}` {
		t.Fatalf("frames %q (%v)", f, err)
	}
	l.frames(c, appendServerText(nil, []byte(`{"op":"read","room":"r0","seq":2}`)), now)
	if l.st.ReadAnswers != 1 || len(l.st.Errors) != 0 {
		t.Fatalf("answers %d, errors %v", l.st.ReadAnswers, l.st.Errors)
	}
}

// readClientFrames decodes the masked text frames a bench connection
// queued.
func readClientFrames(b []byte) ([]string, error) {
	var out []string
	r := bytes.NewReader(b)
	for r.Len() > 0 {
		h, err := ws.ReadHeader(r)
		if err != nil {
			return out, err
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(r, p); err != nil {
			return out, err
		}
		ws.Cipher(p, h.Mask, 0)
		out = append(out, string(p))
	}
	return out, nil
}

// --read-marks through a real node: every received message marked, every
// mark answered, the node writing the positions.
func TestPublishReadMarks(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "publish", "--url", n.url, "--rooms=20", "--rate=100", "--read-marks", "--drain=5s")
	r := rep.Levels[0]
	if r.ReadMarks == 0 || r.ReadMarks < r.Delivered*9/10 || len(r.Errors) != 0 {
		t.Fatalf("read marks %d for %d delivered, errors %v", r.ReadMarks, r.Delivered, r.Errors)
	}
	if r.ReadAnswers < r.ReadMarks*9/10 {
		t.Errorf("answers %d for %d marks", r.ReadAnswers, r.ReadMarks)
	}
	if w := n.metric(t, "roost_read_marks_written_total") + n.metric(t, "roost_read_marks_coalesced_total"); w == 0 {
		t.Errorf("the node wrote and coalesced no read mark")
	}
}
