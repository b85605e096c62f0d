package test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// redisKeys lists the keys of prefix with their PTTL (-1: none).
func redisKeys(t *testing.T, prefix string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, k := range strings.Fields(redistest.CLI(t, 6379, "--scan", "--pattern", prefix+".*")) {
		var ttl int
		fmt.Sscan(strings.TrimSpace(redistest.CLI(t, 6379, "pttl", k)), &ttl)
		if ttl != -2 { // gone between the scan and the PTTL
			out[k] = ttl
		}
	}
	return out
}

// TestRedisKeysExpireWithNodes: the nodes' per-node Redis keys (the
// connection counts' `*.conns.nodes`, presence's `*.pr.nodes`, each node's
// room list and its rooms' keys) had no TTL and stayed after every node
// stopped. Now every key the nodes write expires: while the nodes run
// each has a TTL, and once they stopped (one drained, one killed) nothing
// of theirs is left after presence's keep (8 × the 1 s lease) has passed.
func TestRedisKeysExpireWithNodes(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	nodes := startNodes(t, e, 2, "--presence-lease", "1s", "--presence-grace", "300ms")
	for i, n := range nodes {
		for j := 0; j < 3; j++ {
			presenceClient(t, n, fmt.Sprintf("u%d-%d", i, j), fmt.Sprintf("r%d", j), j == 0)
		}
	}
	asker := presenceClient(t, nodes[0], "asker", "other", false)
	joined := time.Now()
	// Past a lease renewal and a share of the counts.
	time.Sleep(1500 * time.Millisecond)
	keys := redisKeys(t, e.prefix)
	var names []string
	for k, ttl := range keys {
		names = append(names, fmt.Sprintf("%s (%d ms)", strings.TrimPrefix(k, e.prefix), ttl))
		if ttl < 0 {
			t.Errorf("%s has no TTL", k)
		}
	}
	sort.Strings(names)
	t.Logf("keys while the nodes run: %v", names)
	for _, want := range []string{".conns.nodes", ".pr.nodes"} {
		if _, ok := keys[e.prefix+want]; !ok {
			t.Errorf("no %s while the nodes run", want)
		}
	}
	// Nothing the nodes still need expires: past keep with no change, the
	// rooms' presence is whole.
	time.Sleep(time.Until(joined.Add(10 * time.Second)))
	for j := 0; j < 3; j++ {
		if err := asker.Send(fmt.Sprintf(`{"op":"presence","room":"r%d"}`, j)); err != nil {
			t.Fatal(err)
		}
		if _, m, err := asker.Expect("presence", 5*time.Second); err != nil || m["count"].(float64) != 2 {
			t.Fatalf("presence of r%d 10 s after the joins: %v %v", j, m, err)
		}
	}
	if left := redisKeys(t, e.prefix); len(left) != len(keys) {
		t.Fatalf("10 s after the joins %d keys, want the %d there were: %v", len(left), len(keys), left)
	}
	stopped := time.Now()
	nodes[0].Stop()
	nodes[1].Kill()
	redistest.WaitFor(t, 8*time.Second+3*time.Second, func() error {
		if left := redisKeys(t, e.prefix); len(left) > 0 {
			return fmt.Errorf("%d keys left %v after the nodes stopped: %v", len(left), time.Since(stopped), left)
		}
		return nil
	})
	t.Logf("every key gone %v after the nodes stopped", time.Since(stopped))
}
