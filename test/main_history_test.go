package test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

func mustDial(t *testing.T, addr, query string) *opsClient {
	t.Helper()
	c, err := dialOpsWith(t, addr, query, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rssBytes reads a process's resident set size.
func rssBytes(t testing.TB, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Case 3: history cannot blow up memory: 3 connections pipelining 40
// history requests with limit 1000 in a room of 60 KB messages (60 MB of
// history) took the node from 266 MB to 2.5 GB of RSS, each answer built
// as one 60 MB frame, also for connections already closed. Answers are now
// bounded by bytes and read one at a time per connection, paced by what
// the client reads; 20 connections that ask as much and close at once cost
// nothing more; past 64 waiting requests a connection is told to read its
// answers first; and bystanders of another app keep their connection,
// their latency and every acked message, the node ready throughout.
func TestHistoryMemoryBounded(t *testing.T) {
	n := plainNode(t, 0, false, "--keep", "1000")
	pid := n.Cmd.Process.Pid
	by := newBystanders(t, "127.0.0.2", n.Addr)
	p := mustDial(t, n.Addr, "user=p&app=hm")
	body := strings.Repeat("x", 60<<10)
	const msgs = 1000
	for i := 0; i < msgs; i += 50 {
		for k := i; k < i+50; k++ {
			if err := p.send(fmt.Sprintf(`{"op":"pub","room":"big","id":"m%d","body":%q}`, k, body)); err != nil {
				t.Fatal(err)
			}
		}
		for k := 0; k < 50; k++ {
			p.expect("ack")
		}
	}
	before := rssBytes(t, pid)

	var peak atomic.Int64
	peak.Store(before)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if r := rssBytes(t, pid); r > peak.Load() {
				peak.Store(r)
			}
		}
	}()
	const conns, each = 3, 40
	var wg sync.WaitGroup
	answers := make([]int, conns)
	bytesIn := make([]int, conns)
	for c := 0; c < conns; c++ {
		cl := mustDial(t, n.Addr, fmt.Sprintf("user=h%d&app=hm", c))
		for i := 0; i < each; i++ {
			if err := cl.send(`{"op":"history","room":"big","limit":1000}`); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				select {
				case f, ok := <-cl.frames:
					if !ok || f.json["op"] != "history" {
						return
					}
					answers[c]++
					bytesIn[c] += f.size
				case <-time.After(30 * time.Second):
					return
				}
			}
		}()
	}
	wg.Wait()
	// Connections that ask as much and are gone at once: nothing is built
	// for them.
	for c := 0; c < 20; c++ {
		cl := mustDial(t, n.Addr, fmt.Sprintf("user=gone%d&app=hm", c))
		if _, err := cl.conn.Write(historyBurst(each, `{"op":"history","room":"big","limit":1000}`)); err != nil {
			t.Fatal(err)
		}
		cl.conn.Close()
	}
	by.check("while 23 connections pipeline history", max(10*by.baseline, 250*time.Millisecond))
	if code := n.Readyz(); code != 200 {
		t.Errorf("/readyz %d after the history requests", code)
	}
	close(stop)
	<-sampled
	for c := range answers {
		if answers[c] != each {
			t.Fatalf("connection %d got %d history answers of %d", c, answers[c], each)
		}
	}
	grew := peak.Load() - before
	t.Logf("RSS %d MB before, peak %d MB during %dx%d history requests (%d MB of answers per connection) and 20x%d of closed connections",
		before>>20, peak.Load()>>20, conns, each, bytesIn[0]>>20, each)
	if grew > 128<<20 {
		t.Fatalf("RSS grew by %d MB answering history, want under 128 MB", grew>>20)
	}

	// 300 requests in one write: one is read at once, 64 wait, the other
	// 235 are refused with the reason, each answered, in order.
	q := mustDial(t, n.Addr, "user=greedy&app=hm")
	if _, err := q.conn.Write(historyBurst(300, `{"op":"history","room":"big","limit":1}`)); err != nil {
		t.Fatal(err)
	}
	histories, refused := 0, 0
	for i := 0; i < 300; i++ {
		f := q.expectAny(10 * time.Second)
		switch {
		case f.json["op"] == "history":
			histories++
		case f.json["op"] == "err" && f.json["code"] == "rate_limited" && f.json["ref"] == "big" &&
			strings.Contains(fmt.Sprint(f.json["message"]), "read the answers first"):
			refused++
		default:
			t.Fatalf("answer %d: %s", i, f.data)
		}
	}
	if histories != 65 || refused != 235 {
		t.Errorf("300 pipelined history requests: %d answered, %d refused; want 65 (one read, 64 waiting) and 235", histories, refused)
	}
	if err := q.send(`{"op":"ping"}`); err != nil {
		t.Fatal(err)
	}
	q.expect("pong")
	by.check("after the history requests", max(10*by.baseline, 250*time.Millisecond))
}

// historyBurst is k copies of the command as masked client frames, to be
// written at once: the node reads them in one go.
func historyBurst(k int, cmd string) []byte {
	var b bytes.Buffer
	for i := 0; i < k; i++ {
		_ = ws.WriteFrame(&b, ws.MaskFrame(ws.NewTextFrame([]byte(cmd))))
	}
	return b.Bytes()
}

// expectAny reads the next text frame within d.
func (c *opsClient) expectAny(d time.Duration) opsFrame {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			c.t.Fatal("connection ended")
		}
		if f.op != ws.OpText {
			c.t.Fatalf("opcode %v %s", f.op, f.data)
		}
		return f
	case <-time.After(d):
		c.t.Fatalf("nothing within %s", d)
	}
	return opsFrame{}
}
