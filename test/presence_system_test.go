package test

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// presenceClient dials n as user, joins room (with presence when watch)
// and waits for joined.
func presenceClient(t *testing.T, n *roostNode, user, room string, watch bool) *prototest.Client {
	t.Helper()
	c := prototest.DialT(t, "ws://"+n.Addr+"/ws?user="+user+"&app="+testApp, prototest.Options{})
	join := `{"op":"join","room":"` + room + `"}`
	if watch {
		join = `{"op":"join","room":"` + room + `","presence":true}`
	}
	if err := c.Send(join); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Expect("joined", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// nextDiff waits for the next presence_diff and returns its names, sorted.
func nextDiff(t *testing.T, c *prototest.Client, d time.Duration) (joined, left []string) {
	t.Helper()
	_, m, err := c.Expect("presence_diff", d)
	if err != nil {
		t.Fatalf("no presence_diff: %v", err)
	}
	for _, v := range m["joined"].([]any) {
		joined = append(joined, v.(string))
	}
	for _, v := range m["left"].([]any) {
		left = append(left, v.(string))
	}
	sort.Strings(joined)
	sort.Strings(left)
	return joined, left
}

// A node killed with SIGKILL cannot say its users left: its lease ends
// (--presence-lease 2s here) and the surviving node takes them out, once
// each, leaving the survivor's own users in place.
func TestPresenceNodeKilled(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	nodes := startNodes(t, e, 2, "--presence-lease", "2s", "--presence-grace", "300ms")
	a, b := nodes[0], nodes[1]
	w := presenceClient(t, b, "watcher", "r", true)
	if j, _ := nextDiff(t, w, 5*time.Second); !slices.Equal(j, []string{"watcher"}) {
		t.Fatalf("own join: %v", j)
	}
	for i := 0; i < 3; i++ {
		presenceClient(t, a, fmt.Sprintf("a%d", i), "r", false)
	}
	presenceClient(t, a, "both", "r", false)
	presenceClient(t, b, "both", "r", false) // also on the survivor: stays
	var joined []string
	for len(joined) < 4 {
		j, l := nextDiff(t, w, 5*time.Second)
		if len(l) != 0 {
			t.Fatalf("left %v before the kill", l)
		}
		joined = append(joined, j...)
	}
	sort.Strings(joined)
	if !slices.Equal(joined, []string{"a0", "a1", "a2", "both"}) {
		t.Fatalf("joined %v", joined)
	}
	killed := time.Now()
	a.Kill()
	j, l := nextDiff(t, w, 10*time.Second)
	took := time.Since(killed)
	if len(j) != 0 || !slices.Equal(l, []string{"a0", "a1", "a2"}) {
		t.Fatalf("after the kill: joined %v left %v", j, l)
	}
	// Not before the lease could have ended (renewed every 400 ms: at
	// least 1.6 s of it was left), not long after.
	if took < 1500*time.Millisecond || took > 6*time.Second {
		t.Fatalf("left %v after the kill, want about the 2s lease", took)
	}
	t.Logf("the killed node's users left %v after SIGKILL (lease 2s)", took)
	if err := w.Send(`{"op":"presence","room":"r"}`); err != nil {
		t.Fatal(err)
	}
	_, m, err := w.Expect("presence", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m["count"].(float64) != 2 {
		t.Fatalf("presence after the kill: %v", m)
	}
	// Nothing more: no second left, no flap.
	if _, _, err := w.Expect("presence_diff", 2*time.Second); err == nil {
		t.Fatal("a second presence_diff after the kill")
	}
}
