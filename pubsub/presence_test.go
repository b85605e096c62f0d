package pubsub

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub/redistest"
)

type ch = PresenceChange

func j(key, user string) ch { return ch{Op: PresenceJoin, Key: key, User: user} }
func l(key, user string) ch { return ch{Op: PresenceLeave, Key: key, User: user} }
func w(key string) ch       { return ch{Op: PresenceWatch, Key: key} }

// apply returns the diffs of watched rooms (those presence subscribers
// get); applyAll every transition (those connection events are made of).
func apply(t testing.TB, p Presence, c ...ch) map[string][2][]string {
	t.Helper()
	return applyDiffs(t, p, true, c...)
}

func applyAll(t testing.TB, p Presence, c ...ch) map[string][2][]string {
	t.Helper()
	return applyDiffs(t, p, false, c...)
}

func applyDiffs(t testing.TB, p Presence, watchedOnly bool, c ...ch) map[string][2][]string {
	t.Helper()
	d, err := p.Apply(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2][]string{}
	for _, x := range d {
		if watchedOnly && !x.Watched {
			continue
		}
		e := out[x.Key]
		e[0] = append(e[0], x.Joined...)
		e[1] = append(e[1], x.Left...)
		sort.Strings(e[0])
		sort.Strings(e[1])
		out[x.Key] = e
	}
	return out
}

func count(t testing.TB, p Presence, key string) int {
	t.Helper()
	n, err := p.Count(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// testPresenceContract runs over both implementations: nodes() returns the
// Presence of each node of one deployment (one for the in-process one).
func testPresenceContract(t *testing.T, nodes []Presence) {
	a, b := nodes[0], nodes[len(nodes)-1]
	// Unwatched: counted, no watched diff, but its transitions all the
	// same (connection events), once each.
	if d := applyAll(t, a, j("x/r", "alice"), j("x/r", "bob")); !slices.Equal(d["x/r"][0], []string{"alice", "bob"}) || len(d) != 1 {
		t.Fatalf("transitions of an unwatched room: %v", d)
	}
	if d := applyAll(t, a, j("x/r", "alice")); len(d) != 0 {
		t.Fatalf("a repeated join made a transition: %v", d)
	}
	if d := applyAll(t, a, j("x/u", "alice"), l("x/u", "alice"), j("x/u", "dave")); !slices.Equal(d["x/u"][0], []string{"alice", "dave"}) || !slices.Equal(d["x/u"][1], []string{"alice"}) {
		t.Fatalf("transitions of an unwatched room: %v", d)
	}
	applyAll(t, a, l("x/u", "dave"))
	if n := count(t, b, "x/r"); n != 2 {
		t.Fatalf("count %d", n)
	}
	d := apply(t, a, w("x/r"), j("x/r", "carol"), l("x/r", "alice"))
	if got := d["x/r"]; !slices.Equal(got[0], []string{"carol"}) || !slices.Equal(got[1], []string{"alice"}) {
		t.Fatalf("diff %v", d)
	}
	// Idempotent: the same changes again are no change.
	if d := apply(t, a, j("x/r", "carol"), l("x/r", "alice")); len(d) != 0 {
		t.Fatalf("repeated changes made a diff: %v", d)
	}
	n, users, err := b.Query(context.Background(), "x/r", 1000)
	sort.Strings(users)
	if err != nil || n != 2 || !slices.Equal(users, []string{"bob", "carol"}) {
		t.Fatalf("query %d %v %v", n, users, err)
	}
	if len(nodes) > 1 {
		// bob on b too: one user; b's leave of bob is no change while a
		// has him.
		if d := apply(t, b, j("x/r", "bob")); len(d) != 0 {
			t.Fatalf("second node's bob: %v", d)
		}
		if d := apply(t, b, l("x/r", "bob")); len(d) != 0 {
			t.Fatalf("second node's bob left: %v", d)
		}
		if n := count(t, a, "x/r"); n != 2 {
			t.Fatalf("count %d", n)
		}
	}
	d = apply(t, a, l("x/r", "bob"), l("x/r", "carol"))
	if got := d["x/r"]; len(got[0]) != 0 || !slices.Equal(got[1], []string{"bob", "carol"}) {
		t.Fatalf("diff %v", d)
	}
	if n := count(t, b, "x/r"); n != 0 {
		t.Fatalf("count %d after everyone left", n)
	}
	// Many rooms counted at once.
	apply(t, a, j("x/c1", "alice"), j("x/c1", "bob"), j("x/c3", "carol"))
	counts := []int{-1, -1, -1}
	if err := b.Counts(context.Background(), []string{"x/c1", "x/c2", "x/c3"}, counts); err != nil || !slices.Equal(counts, []int{2, 0, 1}) {
		t.Fatalf("counts %v, %v", counts, err)
	}
	if err := b.Counts(context.Background(), nil, nil); err != nil {
		t.Fatalf("no rooms: %v", err)
	}
	// The names' limit.
	var many []ch
	for i := 0; i < 30; i++ {
		many = append(many, j("x/big", fmt.Sprintf("u%d", i)))
	}
	apply(t, a, many...)
	if n, users, err := b.Query(context.Background(), "x/big", 10); err != nil || n != 30 || len(users) != 10 {
		t.Fatalf("query %d, %d names, %v", n, len(users), err)
	}
}

func TestMemoryPresenceContract(t *testing.T) {
	testPresenceContract(t, []Presence{NewMemoryPresence()})
}

func redisPresences(t testing.TB, cfg RedisConfig, k int, lease time.Duration) []*RedisPresence {
	var out []*RedisPresence
	for i := 0; i < k; i++ {
		r := newTestRedis(t, cfg, &benchHandler{})
		out = append(out, r.NewPresence(RedisPresenceConfig{Lease: lease, Grace: 100 * time.Millisecond}))
	}
	return out
}

func TestRedisPresenceContract(t *testing.T) {
	redistest.Require(t)
	ps := redisPresences(t, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}, 2, time.Minute)
	testPresenceContract(t, []Presence{ps[0], ps[1]})
}

// On a Redis Cluster: each room's keys share its slot (the hash tag), the
// node keys live elsewhere; a dead node is cleaned all the same.
func TestRedisPresenceCluster(t *testing.T) {
	redistest.RequireBinaries(t)
	c := redistest.StartCluster(t)
	cfg := RedisConfig{Addrs: []string{c[0].Addr(), c[1].Addr()}, Prefix: redistest.Prefix(t)}
	ps := redisPresences(t, cfg, 2, time.Second)
	testPresenceContract(t, []Presence{ps[0], ps[1]})
	deadNode(t, ps[0], ps[1])
}

func TestRedisPresenceDeadNode(t *testing.T) {
	redistest.Require(t)
	ps := redisPresences(t, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}, 2, time.Second)
	deadNode(t, ps[0], ps[1])
}

// deadNode: a has users in 20 rooms and stops renewing its lease; b's
// Apply takes them out once the lease ended, once (b watches the rooms:
// diffs are made for live watchers only).
func deadNode(t *testing.T, a, b *RedisPresence) {
	var c []ch
	for r := 0; r < 20; r++ {
		key := fmt.Sprintf("x/d%d", r)
		c = append(c, w(key), j(key, "gone"), j(key, "stays"))
	}
	c = append(c, j("x/du", "gone")) // unwatched: its transition still comes, unwatched
	apply(t, a, c...)
	var sc []ch
	for r := 0; r < 20; r++ {
		sc = append(sc, w(fmt.Sprintf("x/d%d", r)), j(fmt.Sprintf("x/d%d", r), "stays"))
	}
	apply(t, b, sc...)
	deadline := time.Now().Add(5 * time.Second)
	left := map[string][]string{}
	for len(left) < 21 && time.Now().Before(deadline) {
		d, err := b.Apply(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range d {
			if strings.HasPrefix(x.Key, "x/d") && x.Watched == (x.Key == "x/du") {
				t.Fatalf("room %s: watched %v", x.Key, x.Watched)
			}
			left[x.Key] = append(left[x.Key], x.Left...)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Equal(left["x/du"], []string{"gone"}) {
		t.Fatalf("unwatched room: left %v", left["x/du"])
	}
	for r := 0; r < 20; r++ {
		key := fmt.Sprintf("x/d%d", r)
		if !slices.Equal(left[key], []string{"gone"}) {
			t.Fatalf("room %s: left %v", key, left[key])
		}
		if n := count(t, b, key); n != 1 {
			t.Fatalf("room %s: count %d", key, n)
		}
	}
	// a comes back: told its lease was lost.
	if _, err := a.Apply(context.Background(), nil); err != ErrPresenceLost {
		// Renewal is due only every fifth of the lease.
		time.Sleep(300 * time.Millisecond)
		if _, err := a.Apply(context.Background(), nil); err != ErrPresenceLost {
			t.Fatalf("a's Apply after its lease ended: %v, want ErrPresenceLost", err)
		}
	}
}

// BenchmarkPresenceQuery10k: the read of a presence answer in a room of
// 10,000 users (count and 1000 names) and its frame.
func BenchmarkPresenceQuery10k(b *testing.B) {
	var c []ch
	for i := 0; i < 10000; i++ {
		c = append(c, j("x/big", fmt.Sprintf("user-%05d", i)))
	}
	run := func(b *testing.B, p Presence) {
		apply(b, p, c...)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			n, users, err := p.Query(context.Background(), "x/big", proto.MaxPresenceUsers)
			if err != nil || n != 10000 || len(users) != 1000 {
				b.Fatal(n, len(users), err)
			}
			_ = proto.AppendPresenceFrame(nil, []byte("big"), n, users)
		}
	}
	b.Run("memory", func(b *testing.B) { run(b, NewMemoryPresence()) })
	b.Run("redis", func(b *testing.B) {
		redistest.Require(b)
		run(b, redisPresences(b, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(b)}, 1, time.Minute)[0])
	})
	// A Redis of its own: what the shared one's other clients cost it is
	// not in the figure.
	b.Run("redis-private", func(b *testing.B) {
		redistest.RequireBinaries(b)
		srv := redistest.Start(b, redistest.FreePort(b, false))
		run(b, redisPresences(b, RedisConfig{Addrs: []string{srv.Addr()}, Prefix: redistest.Prefix(b)}, 1, time.Minute)[0])
		b.StopTimer()
		for _, l := range strings.Split(redistest.CLI(b, srv.Port, "info", "commandstats"), "\n") {
			if strings.HasPrefix(l, "cmdstat_hrandfield") || strings.HasPrefix(l, "cmdstat_hlen") {
				b.Log(strings.TrimSpace(l))
			}
		}
	})
}
