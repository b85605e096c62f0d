package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// TestClusterConnLimitConverges: 80 + 80 connections opened at once on two
// nodes against an app limit of 100 all stayed. Each node admits against
// the other's count of the last share, so both admit; once the counts are
// shared, each closes its share of the excess, newest first, with 1008
// `connection limit`, and the cluster ends at the limit exactly.
func TestClusterConnLimitConverges(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	const limit, each = 100, 80
	nodes := startNodes(t, e, 2, "--app-max-conns", fmt.Sprint(limit), "--user-max-conns", "0")
	clients := make([][]*prototest.Client, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c, err := prototest.Dial(ctx, "ws://"+n.Addr+"/ws?user=u"+fmt.Sprint(j)+"&app="+testApp, prototest.Options{})
				cancel()
				if err != nil {
					t.Errorf("%s: dial %d: %v", n.Name, j, err)
					return
				}
				clients[i] = append(clients[i], c)
			}
		}()
	}
	wg.Wait()
	opened := time.Now()
	t.Cleanup(func() {
		for _, cs := range clients {
			for _, c := range cs {
				c.Close()
			}
		}
	})
	live := func() (n int, per []int) {
		per = make([]int, len(clients))
		for i, cs := range clients {
			for _, c := range cs {
				if !c.Dead() {
					per[i]++
				}
			}
			n += per[i]
		}
		return n, per
	}
	admitted, _ := live()
	t.Logf("admitted at once: %d of %d against a limit of %d", admitted, len(nodes)*each, limit)
	// Within 2 s of the counts meeting (shared every 500 ms: they meet
	// within one period of the last open).
	var took time.Duration
	redistest.WaitFor(t, 2500*time.Millisecond, func() error {
		if n, per := live(); n > limit {
			return fmt.Errorf("%d connections open (%v), limit %d", n, per, limit)
		}
		took = time.Since(opened)
		return nil
	})
	// Not more than needed, not later either.
	time.Sleep(1500 * time.Millisecond)
	n, per := live()
	if n != limit {
		t.Fatalf("%d connections open (%v) after the limit was enforced, want exactly %d", n, per, limit)
	}
	t.Logf("at the limit %v after the last open; open per node %v", took, per)
	for i, cs := range clients {
		closed := 0
		newest := len(cs)
		for j, c := range cs {
			if !c.Dead() {
				continue
			}
			closed++
			newest = min(newest, j)
			if err := c.Err(); err == nil || !strings.Contains(err.Error(), `1008 "connection limit"`) {
				t.Errorf("%s: connection %d ended with %v, want 1008 connection limit", nodes[i].Name, j, err)
			}
		}
		// Newest first: the closed ones are the last opened (the node
		// orders by the millisecond it accepted them, then by accept
		// order on its loop).
		if newest < len(cs)-closed {
			t.Errorf("%s: closed %d, the oldest of them opened %dth of %d: not the newest", nodes[i].Name, closed, newest+1, len(cs))
		}
		if c := nodes[i].Metrics(t)[`roost_app_refusals_total{app="`+testApp+`",reason="conn_limit"}`]; int(c) < closed {
			t.Errorf("%s: conn_limit refusals %v, want at least the %d closed", nodes[i].Name, c, closed)
		}
	}
}
