//go:build linux

package bench

import (
	"strconv"
	"testing"
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
