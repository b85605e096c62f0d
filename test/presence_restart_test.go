package test

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// restartable starts a node with the memory store (no database) that can
// be stopped and started again on the same ports.
func restartable(t *testing.T, name string, extra ...string) *roostNode {
	t.Helper()
	return startPlain(t, harness.Spec{Name: name, Args: extra}, false)
}

// restart stops n (SIGTERM: it drains) and starts it again with the same
// ports and flags; it returns the new process and when it was ready.
func restart(t *testing.T, n *roostNode, extra ...string) (*roostNode, time.Time) {
	t.Helper()
	n.Stop()
	m := startPlain(t, harness.Spec{Name: n.Name, Addr: n.Addr, Admin: n.Admin, Args: extra}, false)
	return m, time.Now()
}

// presenceUser is a client as roost.js is one: it joins with presence and,
// after a reconnect, with since; it asks presence right after joined.
type presenceUser struct {
	name string
	c    *prototest.Client
	seq  uint64
}

// expect skips frames until one of op (diffs, msgs) and returns it.
func (u *presenceUser) expect(op string) (map[string]any, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := u.c.Next(time.Until(deadline))
		if err != nil {
			return nil, fmt.Errorf("waiting for %s: %w", op, err)
		}
		if m := f.Map(); m["op"] == op {
			return m, nil
		}
	}
}

func (u *presenceUser) join(t *testing.T, n *roostNode) {
	t.Helper()
	u.c = prototest.DialT(t, "ws://"+n.Addr+"/ws?user="+u.name+"&app="+testApp, prototest.Options{})
	join := `{"op":"join","room":"r","presence":true}`
	if u.seq > 0 {
		join = fmt.Sprintf(`{"op":"join","room":"r","presence":true,"since":%d}`, u.seq)
	}
	if err := u.c.Send(join); err != nil {
		t.Fatal(err)
	}
	if _, err := u.expect("joined"); err != nil {
		t.Fatalf("%s: %v", u.name, err)
	}
}

// ask sends presence and returns the users answered, sorted.
func (u *presenceUser) ask(t *testing.T) (int, []string) {
	t.Helper()
	if err := u.c.Send(`{"op":"presence","room":"r"}`); err != nil {
		t.Fatal(err)
	}
	m, err := u.expect("presence")
	if err != nil {
		t.Fatalf("%s: %v", u.name, err)
	}
	var names []string
	for _, v := range m["users"].([]any) {
		names = append(names, v.(string))
	}
	sort.Strings(names)
	return int(m["count"].(float64)), names
}

// presenceAfterRestart: users u0..u2 on nodes (round robin) publish and
// join room r with presence; node 0 restarts; its users reconnect and
// rejoin with since, as roost.js does. Within 2 s of the node being back,
// every user's presence answers all three.
func presenceAfterRestart(t *testing.T, nodes []*roostNode, extra ...string) {
	users := make([]*presenceUser, 3)
	on := func(i int) *roostNode { return nodes[i%len(nodes)] }
	for i := range users {
		users[i] = &presenceUser{name: fmt.Sprintf("u%d", i)}
		users[i].join(t, on(i))
	}
	all := []string{"u0", "u1", "u2"}
	converged := func(d time.Duration) time.Duration {
		start := time.Now()
		for {
			ok := true
			var got string
			for _, u := range users {
				n, names := u.ask(t)
				if n != 3 || !slices.Equal(names, all) {
					ok = false
					got = fmt.Sprintf("%s sees count %d %v", u.name, n, names)
				}
			}
			if ok {
				return time.Since(start)
			}
			if time.Since(start) > d {
				t.Fatalf("presence not converged after %v: %s", d, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	converged(5 * time.Second)
	for i, u := range users {
		if err := u.c.Send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i)); err != nil {
			t.Fatal(err)
		}
		m, err := u.expect("ack")
		if err != nil {
			t.Fatal(err)
		}
		u.seq = uint64(m["seq"].(float64))
	}
	var back time.Time
	nodes[0], back = restart(t, nodes[0], extra...)
	var back2 []string
	for i, u := range users {
		if i%len(nodes) == 0 {
			u.c.Close()
			u.join(t, nodes[0])
			back2 = append(back2, u.name)
			// Asked right after joined, as roost.js does: the answer has
			// the user itself and whoever rejoined before it.
			n, names := u.ask(t)
			for _, want := range back2 {
				if !slices.Contains(names, want) {
					t.Fatalf("%s right after its rejoin: count %d %v, want %v in it", u.name, n, names, want)
				}
			}
		}
	}
	took := converged(2*time.Second + time.Since(back))
	t.Logf("presence converged %v after the rejoins (%v after the node was back)", took, time.Since(back))
	// And stays so past the old process's grace and lease.
	for time.Since(back) < 8*time.Second {
		for _, u := range users {
			if n, names := u.ask(t); n != 3 || !slices.Equal(names, all) {
				t.Fatalf("%v after the node was back, %s sees count %d %v", time.Since(back), u.name, n, names)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPresenceAfterRestart: the memory store, one node restarted, with
// in-process presence and with Redis presence, alone and beside another
// node. (A joined user's own presence answered count 0, and lists missed
// online users, for 10-25 s after a restart.)
func TestPresenceAfterRestart(t *testing.T) {
	t.Run("one node", func(t *testing.T) {
		presenceAfterRestart(t, []*roostNode{restartable(t, "a")})
	})
	t.Run("one node redis", func(t *testing.T) {
		redistest.Require(t)
		extra := []string{"--redis-url", "redis://" + redistest.Addr + "?prefix=" + redistest.Prefix(t)}
		presenceAfterRestart(t, []*roostNode{restartable(t, "a", extra...)}, extra...)
	})
	t.Run("two nodes redis", func(t *testing.T) {
		redistest.Require(t)
		extra := []string{"--redis-url", "redis://" + redistest.Addr + "?prefix=" + redistest.Prefix(t)}
		presenceAfterRestart(t, []*roostNode{restartable(t, "a", extra...), restartable(t, "b", extra...)}, extra...)
	})
}
