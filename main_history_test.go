package main_test

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// History cannot blow up memory: 3 connections pipelining 40 history
// requests with limit 1000 in a room of 60 KB messages (60 MB of history)
// took the node from 266 MB to 2.5 GB of RSS, each answer built as one 60 MB
// frame. Answers are now bounded by bytes and read one at a time per
// connection, paced by what the client reads.
func TestHistoryMemoryBounded(t *testing.T) {
	n := plainNode(t, 0, false, "--keep", "1000")
	pid := n.cmd.Process.Pid
	p := mustDial(t, n.addr, "user=p&app=hm")
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
		cl := mustDial(t, n.addr, fmt.Sprintf("user=h%d&app=hm", c))
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
	close(stop)
	<-sampled
	for c := range answers {
		if answers[c] != each {
			t.Fatalf("connection %d got %d history answers of %d", c, answers[c], each)
		}
	}
	grew := peak.Load() - before
	t.Logf("RSS %d MB before, peak %d MB during %dx%d history requests (%d MB of answers per connection)",
		before>>20, peak.Load()>>20, conns, each, bytesIn[0]>>20)
	if grew > 128<<20 {
		t.Fatalf("RSS grew by %d MB answering history, want under 128 MB", grew>>20)
	}
}
