//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/test/harness"
)

// The scenario tests run the real node: the roost binary built once per
// test process by test/harness, started per test on free loopback ports.

type testNode struct {
	url   string
	pid   int
	admin string
	node  *harness.Node
}

// metric reads one counter from the node's /metrics.
func (n testNode) metric(t *testing.T, name string) uint64 {
	t.Helper()
	v, ok := n.node.Metrics(t)[name]
	if !ok {
		t.Fatalf("node has no metric %s", name)
	}
	return uint64(v)
}

// checkNodeCounters compares the bench's totals with the node's own: every
// publish the bench sent was stored and acked, and every frame the node
// wrote was received.
func checkNodeCounters(t *testing.T, n testNode, rep *Report) {
	t.Helper()
	if got := n.metric(t, "roost_publishes_total"); got != rep.TotalSent {
		t.Errorf("node stored %d publishes, bench sent %d", got, rep.TotalSent)
	}
	if got := n.metric(t, "roost_acks_total"); got != rep.TotalSent {
		t.Errorf("node acked %d publishes, bench sent %d", got, rep.TotalSent)
	}
	// The node counts a frame when its write returns, which can be after
	// the bench read it: give the count a moment to settle.
	got := n.metric(t, "roost_frames_out_total")
	for deadline := time.Now().Add(5 * time.Second); got != rep.TotalFrames && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		got = n.metric(t, "roost_frames_out_total")
	}
	if got != rep.TotalFrames {
		t.Errorf("node sent %d frames, bench received %d", got, rep.TotalFrames)
	}
}

// startNode runs `roost serve --insecure` and waits until it is ready.
func startNode(t *testing.T, extra ...string) testNode {
	t.Helper()
	return startNodeMode(t, "", "", true, extra...)
}

// startNodeAt runs a node on the given addresses ("" for a free port), so
// that a test can start it again where it was; a test may kill it through
// testNode.node (the harness stops it otherwise).
func startNodeAt(t *testing.T, addr, admin string, extra ...string) testNode {
	t.Helper()
	return startNodeMode(t, addr, admin, true, extra...)
}

// startNodeMode is startNodeAt, in token mode unless insecure.
func startNodeMode(t *testing.T, addr, admin string, insecure bool, extra ...string) testNode {
	t.Helper()
	args := []string{"--api", "off"}
	if insecure {
		args = append(args, "--insecure")
	}
	n := harness.Start(t, harness.Spec{Name: "node", Addr: addr, Admin: admin, Args: append(args, extra...)})
	return testNode{url: "ws://" + n.Addr + "/ws", pid: n.PID(), admin: n.Admin, node: n}
}

// runBench runs one scenario in its short form and returns the report.
func runBench(t *testing.T, args ...string) *Report {
	t.Helper()
	args = append(args, "--warmup=1s", "--duration=2s", "--json")
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	if code != 0 {
		t.Fatalf("roost bench %v: exit %d\n%s\n%s", args, code, errb.String(), out.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("cannot decode report: %v\n%s", err, out.String())
	}
	return &rep
}

// checkLevel asserts the exact counts a healthy node gives: every window
// publish acked and delivered to each member, in order, nobody closed.
func checkLevel(t *testing.T, r LevelResult, members uint64) {
	t.Helper()
	if r.Sent == 0 {
		t.Fatalf("nothing sent: %+v", r)
	}
	if r.Acked != r.Sent {
		t.Errorf("acked %d of %d sent", r.Acked, r.Sent)
	}
	if r.Expected != r.Sent*members {
		t.Errorf("expected %d deliveries, want sent %d × %d members", r.Expected, r.Sent, members)
	}
	if r.Delivered != r.Expected {
		t.Errorf("delivered %d of %d", r.Delivered, r.Expected)
	}
	if r.Latency.Count != r.Delivered || r.AckLatency.Count != r.Acked {
		t.Errorf("latency counts %d/%d, ack %d/%d", r.Latency.Count, r.Delivered, r.AckLatency.Count, r.Acked)
	}
	if r.Gaps+r.Duplicates+r.Reordered+r.Missing != 0 || r.AckedNotReceived != 0 {
		t.Errorf("sequence errors: %+v", r)
	}
	if len(r.Closes) != 0 || len(r.Errors) != 0 {
		t.Errorf("closes %v errors %v", r.Closes, r.Errors)
	}
	if r.RecvFrames == 0 || r.BenchUsPerFrame <= 0 {
		t.Errorf("no frames or no bench CPU: %+v", r)
	}
	// the window owes offered × 2 s publishes: sent, or counted as the
	// bench's own lateness when this shared machine did not schedule it
	if want := r.Offered * r.Window; math.Abs(float64(r.Sent+r.BenchDropped)-want) > 0.02*want+float64(r.Offered)/50+2 {
		t.Errorf("sent %d + late %d in the window, offered %.0f", r.Sent, r.BenchDropped, want)
	}
}

func TestDelivery(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "delivery", "--url", n.url, "--members=40", "--publishers=5", "--rate=200",
		"--pid", strconv.Itoa(n.pid))
	if rep.Connections != 45 || len(rep.Levels) != 1 {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Levels[0]
	checkLevel(t, r, 45)
	if !r.Sustained {
		t.Errorf("not sustained: %s", r.Broken)
	}
	if r.NodeCPU <= 0 || r.NodeUsPerFrame <= 0 || r.NodeUsPerPublish <= 0 {
		t.Errorf("no node CPU figures: %+v", r)
	}
	checkNodeCounters(t, n, rep)
}

func TestPublishTwoNodesURLs(t *testing.T) {
	n := startNode(t)
	// the same node twice in --url still exercises the round-robin split
	rep := runBench(t, "publish", "--url", n.url+","+n.url, "--rooms=50", "--rate=200")
	checkLevel(t, rep.Levels[0], 1)
	checkNodeCounters(t, n, rep)
}

func TestHotroom(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "hotroom", "--url", n.url, "--publishers=200", "--members=5", "--rate=400")
	checkLevel(t, rep.Levels[0], 5)
	checkNodeCounters(t, n, rep)
}

func TestMixed(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "mixed", "--url", n.url, "--users=400", "--active=0.25", "--interval=1s", "--room-size=20")
	if rep.Publishers != 100 {
		t.Fatalf("publishers %d", rep.Publishers)
	}
	r := rep.Levels[0]
	if r.Delivered != r.Expected || r.Acked != r.Sent || r.Sent == 0 || r.Expected != r.Sent*20 {
		t.Fatalf("mixed counts: %+v", r)
	}
	checkNodeCounters(t, n, rep)
}

func TestChat(t *testing.T) {
	a, b := startNode(t), startNode(t)
	// the same node twice in --url exercises the round-robin split (nodes
	// sharing rooms need PostgreSQL and Redis: the scripts' runs); b only
	// shows that --pid reports each node on its own
	rep := runBench(t, "chat", "--url", a.url+","+a.url, "--rooms=8", "--room-size=12", "--active=0.25",
		"--interval=500ms", "--sizes=100:80,2048:15,4000:5", "--procs=2", "--pid", strconv.Itoa(a.pid)+","+strconv.Itoa(b.pid))
	if rep.Connections != 96 || rep.Publishers != 24 || rep.Procs != 2 {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Levels[0]
	checkLevel(t, r, 12)
	if !r.Sustained {
		t.Errorf("not sustained: %s", r.Broken)
	}
	if len(r.Nodes) != 2 || r.Nodes[0].PID != a.pid || r.Nodes[0].RSS <= 0 || r.Nodes[0].CPU <= 0 || r.Nodes[1].RSS <= 0 {
		t.Errorf("node usage %+v", r.Nodes)
	}
	checkNodeCounters(t, a, rep)
}

func TestSoak(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "soak", "--url", n.url, "--rooms=3", "--members=5", "--publishers=2", "--rate=150")
	checkLevel(t, rep.Levels[0], 7)
	checkNodeCounters(t, n, rep)
}

func TestDensity(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "density", "--url", n.url, "--conns=500", "--rooms=10", "--hold=500ms", "--pid", strconv.Itoa(n.pid))
	if rep.Connections != 500 || rep.RSSAfter <= 0 || rep.KiBPerConn == 0 {
		t.Fatalf("density report %+v", rep)
	}
	if len(rep.ClosesHolding) != 0 {
		t.Fatalf("closes while holding: %v", rep.ClosesHolding)
	}
	checkNodeCounters(t, n, rep) // 500 joined frames, no publishes
}

func TestStepAndPlot(t *testing.T) {
	n := startNode(t)
	plot := filepath.Join(t.TempDir(), "step.svg")
	rep := runBench(t, "delivery", "--url", n.url, "--members=10", "--publishers=2", "--step",
		"--step-start=100", "--step-add=100", "--step-max=300", "--warmup=500ms", "--plot", plot)
	if len(rep.Levels) != 3 || rep.HighestSustained != 300 {
		t.Fatalf("levels %d highest %v: %+v", len(rep.Levels), rep.HighestSustained, rep.Levels)
	}
	for _, r := range rep.Levels {
		checkLevel(t, r, 12)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Fatalf("plot: %v", err)
	}
}

func TestProcsMergeWorkers(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "delivery", "--url", n.url, "--members=30", "--publishers=4", "--rate=200", "--procs=2",
		"--src=127.0.0.2,127.0.0.3")
	if rep.Procs != 2 {
		t.Fatalf("procs %d", rep.Procs)
	}
	checkLevel(t, rep.Levels[0], 34)
	checkNodeCounters(t, n, rep)
}

// A node in token mode: the bench mints a token per connection from the
// app's secret (--secret, here through ROOST_SECRET as an operator would).
func TestSecureNodeTokens(t *testing.T) {
	f := filepath.Join(t.TempDir(), "apps.json")
	const secret = "bench-secret-0123456789abcdef"
	if err := persist.OpenAppFile(f).CreateApp(context.Background(), proto.App{ID: "chat", Secret: secret}); err != nil {
		t.Fatal(err)
	}
	n := startNodeMode(t, "", "", false, "--apps", f)
	t.Setenv("ROOST_SECRET", secret)
	rep := runBench(t, "delivery", "--url", n.url, "--app", "chat", "--members=20", "--publishers=4", "--rate=100",
		"--pid", strconv.Itoa(n.pid))
	r := rep.Levels[0]
	checkLevel(t, r, 24)
	if !r.Sustained {
		t.Errorf("not sustained: %s", r.Broken)
	}
	checkNodeCounters(t, n, rep)
}

// --transport sse: the receivers listen over SSE, the publishers stay on
// WebSocket; every message arrives once, in order.
func TestDeliverySSE(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "delivery", "--url", n.url, "--members=40", "--publishers=5", "--rate=200",
		"--transport=sse", "--pid", strconv.Itoa(n.pid))
	if rep.Connections != 45 || len(rep.Levels) != 1 {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Levels[0]
	checkLevel(t, r, 45)
	if !r.Sustained {
		t.Errorf("not sustained: %s", r.Broken)
	}
	if got := n.metric(t, "roost_sse_streams_total"); got != 40 {
		t.Errorf("node opened %d SSE streams, want the 40 members", got)
	}
	if got := n.metric(t, "roost_acks_total"); got != rep.TotalSent {
		t.Errorf("node acked %d publishes, bench sent %d", got, rep.TotalSent)
	}
}

func TestDensitySSE(t *testing.T) {
	n := startNode(t)
	rep := runBench(t, "density", "--url", n.url, "--conns=500", "--rooms=10", "--hold=500ms", "--transport=sse", "--pid", strconv.Itoa(n.pid))
	if rep.Connections != 500 || rep.RSSAfter <= 0 || rep.KiBPerConn == 0 {
		t.Fatalf("density report %+v", rep)
	}
	if len(rep.ClosesHolding) != 0 {
		t.Fatalf("closes while holding: %v", rep.ClosesHolding)
	}
}
