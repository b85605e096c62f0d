package loop

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bytedance/sonic"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// presenceNode starts a node with the given presence grace; with
// redisAddr, its broker and presence are Redis's (prefix isolates it).
func presenceNode(t *testing.T, redisAddr, prefix string, grace, lease time.Duration, mutate func(*Config)) *node {
	t.Helper()
	cfg := testConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	parts := fanout.Parts{Store: persist.NewMemory(1000), Log: testLogger(), PresenceGrace: grace}
	if redisAddr != "" {
		nb := redisBroker(t, redisAddr, prefix)
		parts.NewBroker = func(h pubsub.Handler) (pubsub.Broker, error) { return nb(h), nil }
		parts.NewPresence = func(bus pubsub.Broker) (pubsub.Presence, error) {
			return bus.(*pubsub.Redis).NewPresence(pubsub.RedisPresenceConfig{Lease: lease, Grace: grace}), nil
		}
	}
	fan, err := fanout.New(cfg.Config, parts)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, fan, testLogger())
	if err != nil {
		_ = fan.Close()
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		_ = fan.Close()
		t.Fatal(err)
	}
	n := &node{srv: srv, fan: fan, store: parts.Store, addr: srv.Addr()}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fan.ClosePublishes()
		_ = srv.Stop(ctx)
		_ = fan.Close()
	})
	return n
}

// diffs reads frames for d and gathers the presence_diff frames of room.
func (c *client) diffs(room string, d time.Duration) (joined, left []string, frames int) {
	c.t.Helper()
	end := time.Now().Add(d)
	for {
		m, ok := c.tryRecv(end)
		if !ok {
			break
		}
		if m["op"] == "presence_diff" && m["room"] == room {
			frames++
			joined = append(joined, strs(m["joined"])...)
			left = append(left, strs(m["left"])...)
		}
	}
	sort.Strings(joined)
	sort.Strings(left)
	return joined, left, frames
}

// diffsUntil gathers the presence_diff frames of room until done holds
// for what was gathered (sorted), or until d passed: a wait on the
// condition, not a fixed window, so a slow node costs time, not the test.
func (c *client) diffsUntil(room string, d time.Duration, done func(joined, left []string) bool) (joined, left []string) {
	c.t.Helper()
	end := time.Now().Add(d)
	for !done(joined, left) {
		m, ok := c.tryRecv(end)
		if !ok {
			break
		}
		if m["op"] == "presence_diff" && m["room"] == room {
			joined = append(joined, strs(m["joined"])...)
			left = append(left, strs(m["left"])...)
			sort.Strings(joined)
			sort.Strings(left)
		}
	}
	return joined, left
}

// has reports whether got holds every one of want.
func has(got []string, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// tryRecv reads the next text frame, or reports false at end.
func (c *client) tryRecv(end time.Time) (map[string]any, bool) {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(end)
	f, err := prototest.ReadFrame(c.rd)
	if err != nil {
		return nil, false
	}
	m := map[string]any{}
	if f.Op == ws.OpText {
		if err := sonic.Unmarshal(f.Data, &m); err != nil {
			c.t.Fatalf("server frame is not JSON: %q", f.Data)
		}
	}
	return m, true
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// untilDiff reads until a presence_diff of room arrives and returns it.
func (c *client) untilDiff(room string) (joined, left []string) {
	c.t.Helper()
	for {
		m := c.recv()
		if m["op"] == "presence_diff" && m["room"] == room {
			j, l := strs(m["joined"]), strs(m["left"])
			sort.Strings(j)
			sort.Strings(l)
			return j, l
		}
	}
}

// query asks presence of room and returns its count and users.
func (c *client) query(room string) (int, []string, bool) {
	c.t.Helper()
	c.send(`{"op":"presence","room":"` + room + `"}`)
	for {
		m := c.recv()
		if m["op"] == "presence" && m["room"] == room {
			u := strs(m["users"])
			sort.Strings(u)
			return int(num(m["count"])), u, m["more"] == true
		}
	}
}

func join(t *testing.T, n *node, user, room string, presence bool) *client {
	t.Helper()
	c := n.dial(t, user)
	if presence {
		c.send(`{"op":"join","room":"` + room + `","presence":true}`)
	} else {
		c.send(`{"op":"join","room":"` + room + `"}`)
	}
	c.expect(map[string]any{"op": "joined", "room": room})
	return c
}

func TestPresenceInProcess(t *testing.T) {
	n := presenceNode(t, "", "", 300*time.Millisecond, 0, nil)
	w := join(t, n, "watcher", "r", true)
	if j, l := w.untilDiff("r"); !slices.Equal(j, []string{"watcher"}) || len(l) != 0 {
		t.Fatalf("own join: joined %v left %v", j, l)
	}
	a := join(t, n, "alice", "r", false)
	join(t, n, "bob", "r", false)
	join(t, n, "bob", "r", false) // a second connection: one entry
	j, l := w.untilDiff("r")
	if !slices.Equal(j, []string{"alice", "bob"}) || len(l) != 0 {
		t.Fatalf("joined %v left %v", j, l)
	}
	if count, users, more := w.query("r"); count != 3 || !slices.Equal(users, []string{"alice", "bob", "watcher"}) || more {
		t.Fatalf("presence: %d %v more=%v", count, users, more)
	}
	a.conn.Close()
	if j, l := w.untilDiff("r"); len(j) != 0 || !slices.Equal(l, []string{"alice"}) {
		t.Fatalf("after alice closed: joined %v left %v", j, l)
	}
	if count, _, _ := w.query("r"); count != 2 {
		t.Fatalf("count %d after alice left, want 2", count)
	}
	// A query of an empty room, and of a room the client is not in.
	if count, users, _ := w.query("empty"); count != 0 || len(users) != 0 {
		t.Fatalf("empty room: %d %v", count, users)
	}
}

// A reload (close, then a new connection within the grace period) is no
// change: no left, no joined.
func TestPresenceReloadDoesNotFlap(t *testing.T) {
	const grace = 3 * time.Second
	n := presenceNode(t, "", "", grace, 0, nil)
	w := join(t, n, "watcher", "r", true)
	w.untilDiff("r")
	a := join(t, n, "alice", "r", false)
	if j, _ := w.untilDiff("r"); !slices.Equal(j, []string{"alice"}) {
		t.Fatalf("joined %v", j)
	}
	closed := time.Now()
	a.conn.Close()
	time.Sleep(300 * time.Millisecond) // the page reloads
	join(t, n, "alice", "r", false)
	if back := time.Since(closed); back > grace/2 {
		// Not the node's doing: the test itself was too slow to reload
		// within the grace with room to spare.
		t.Fatalf("the reload took %v of the %v grace", back, grace)
	}
	// A flap would be a left at the first tick past the grace, sent at
	// once (the room's last frame is older than a second): the window
	// runs from the close, past that with room for a late tick.
	if j, l, frames := w.diffs("r", time.Until(closed.Add(grace+2*time.Second))); frames != 0 {
		t.Fatalf("reload flapped: %d frames, joined %v left %v", frames, j, l)
	}
}

func TestPresenceLimit(t *testing.T) {
	n := presenceNode(t, "", "", time.Second, 0, func(c *Config) { c.Limits.MaxPresence = 2 })
	join(t, n, "a", "r", true)
	join(t, n, "b", "r", true)
	c := n.dial(t, "c")
	c.send(`{"op":"join","room":"r","presence":true}`)
	c.expect(map[string]any{"op": "err", "ref": "r", "code": "forbidden", "message": fanout.ErrPresenceLimit.Error()})
	c.send(`{"op":"join","room":"r"}`) // without presence: fine
	c.expect(map[string]any{"op": "joined", "room": "r"})
	c.send(`{"op":"join","room":"other","presence":true}`) // another room: its own limit
	c.expect(map[string]any{"op": "joined", "room": "other"})
	c.send(`{"op":"join","room":"x","presence":1}`)
	c.expect(map[string]any{"op": "err", "code": "bad_request", "message": "presence must be true or false"})
}

// Two nodes through Redis: users join and leave on both; each watcher
// sees every change once, counts agree on both nodes.
func TestPresenceTwoNodesRedis(t *testing.T) {
	redistest.Require(t)
	twoNodes(t, redistest.Addr)
}

// The same on a three-shard Redis Cluster: the presence channel and the
// rooms' keys live on their slots' shards.
func TestPresenceTwoNodesRedisCluster(t *testing.T) {
	redistest.RequireBinaries(t)
	c := redistest.StartCluster(t)
	twoNodes(t, c[0].Addr()+","+c[1].Addr())
}

func twoNodes(t *testing.T, addr string) {
	prefix := redistest.Prefix(t)
	a := presenceNode(t, addr, prefix, 300*time.Millisecond, 2*time.Second, nil)
	b := presenceNode(t, addr, prefix, 300*time.Millisecond, 2*time.Second, nil)
	wa := join(t, a, "wa", "r", true)
	wa.untilDiff("r")
	wb := join(t, b, "wb", "r", true)
	if j, _ := wa.untilDiff("r"); !slices.Equal(j, []string{"wb"}) {
		t.Fatalf("wa saw joined %v", j)
	}
	// wb hears of its own join, and of wa's too when a's diff reached b
	// only once wb was there: in the same frame or in one before.
	for seen := []string(nil); !slices.Contains(seen, "wb"); {
		j, l := wb.untilDiff("r")
		if seen = append(seen, j...); len(l) != 0 || slices.ContainsFunc(j, func(u string) bool { return u != "wa" && u != "wb" }) {
			t.Fatalf("wb saw joined %v left %v", j, l)
		}
	}
	x1 := join(t, a, "x", "r", false)
	x2 := join(t, b, "x", "r", false) // x on both nodes: one user
	y := join(t, b, "y", "r", false)
	for _, w := range []*client{wa, wb} {
		j, l := w.diffsUntil("r", 10*time.Second, func(j, _ []string) bool { return has(j, "x", "y") })
		if !slices.Equal(j, []string{"x", "y"}) || len(l) != 0 {
			t.Fatalf("joined %v left %v", j, l)
		}
	}
	for _, w := range []*client{wa, wb} {
		if count, users, _ := w.query("r"); count != 4 || !slices.Equal(users, []string{"wa", "wb", "x", "y"}) {
			t.Fatalf("presence %d %v", count, users)
		}
	}
	x1.conn.Close() // x is still on b
	y.conn.Close()
	for _, w := range []*client{wa, wb} {
		j, l := w.diffsUntil("r", 10*time.Second, func(_, l []string) bool { return has(l, "y") })
		if len(j) != 0 || !slices.Equal(l, []string{"y"}) {
			t.Fatalf("joined %v left %v", j, l)
		}
	}
	// x is still on b, so still present: a wrong leave of x (which the
	// wait above, done at y's, may not have read) would show in the count.
	for _, w := range []*client{wa, wb} {
		if count, users, _ := w.query("r"); count != 3 || !slices.Equal(users, []string{"wa", "wb", "x"}) {
			t.Fatalf("presence after y left: %d %v", count, users)
		}
	}
	x2.conn.Close()
	for _, w := range []*client{wa, wb} {
		if j, l := w.untilDiff("r"); len(j) != 0 || !slices.Equal(l, []string{"x"}) {
			t.Fatalf("joined %v left %v", j, l)
		}
		if count, _, _ := w.query("r"); count != 2 {
			t.Fatalf("count %d, want 2", count)
		}
	}
	if got, err := a.fan.PresenceCount(context.Background(), "test/r"); err != nil || got != 2 {
		t.Fatalf("PresenceCount %d %v", got, err)
	}
}

// 1,000 random joins and leaves over two nodes and 5 rooms: the counts
// are exact once the grace period passed.
func TestPresenceRandomCountsRedis(t *testing.T) {
	redistest.Require(t)
	prefix := redistest.Prefix(t)
	nodes := []*node{
		presenceNode(t, redistest.Addr, prefix, 200*time.Millisecond, 2*time.Second, nil),
		presenceNode(t, redistest.Addr, prefix, 200*time.Millisecond, 2*time.Second, nil),
	}
	randomCounts(t, nodes)
}

func TestPresenceRandomCountsInProcess(t *testing.T) {
	randomCounts(t, []*node{presenceNode(t, "", "", 200*time.Millisecond, 0, nil)})
}

func randomCounts(t *testing.T, nodes []*node) {
	rng := rand.New(rand.NewPCG(1, 2))
	type conn struct {
		c          *client
		user, room string
	}
	var open []conn
	for i := 0; i < 1000; i++ {
		if len(open) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(open))
			cn := open[k]
			if rng.IntN(2) == 0 {
				cn.c.conn.Close()
			} else {
				cn.c.send(`{"op":"leave","room":"` + cn.room + `"}`)
				cn.c.expect(map[string]any{"op": "left"})
			}
			open = slices.Delete(open, k, k+1)
			continue
		}
		user, room := fmt.Sprintf("u%d", rng.IntN(40)), fmt.Sprintf("r%d", rng.IntN(5))
		c := join(t, nodes[rng.IntN(len(nodes))], user, room, false)
		open = append(open, conn{c, user, room})
	}
	want := map[string]map[string]bool{}
	for _, cn := range open {
		if want[cn.room] == nil {
			want[cn.room] = map[string]bool{}
		}
		want[cn.room][cn.user] = true
	}
	q := nodes[0].dial(t, "q")
	checkFor(t, 10*time.Second, func() bool {
		for r := 0; r < 5; r++ {
			room := fmt.Sprintf("r%d", r)
			for _, n := range nodes {
				got, err := n.fan.PresenceCount(context.Background(), "test/"+room)
				if err != nil || got != len(want[room]) {
					return false
				}
			}
		}
		return true
	})
	for r := 0; r < 5; r++ {
		room := fmt.Sprintf("r%d", r)
		count, users, _ := q.query(room)
		var wu []string
		for u := range want[room] {
			wu = append(wu, u)
		}
		sort.Strings(wu)
		if count != len(wu) || !slices.Equal(users, wu) {
			t.Fatalf("room %s: %d %v, want %v", room, count, users, wu)
		}
	}
}

// A node taken for dead while alive (silent past its lease, say a long
// pause) has its users taken out by the others; at its next renewal it
// hears that its lease had ended and applies its whole presence again.
func TestPresenceLeaseLostRecovers(t *testing.T) {
	redistest.Require(t)
	prefix := redistest.Prefix(t)
	a := presenceNode(t, redistest.Addr, prefix, 300*time.Millisecond, 2*time.Second, nil)
	b := presenceNode(t, redistest.Addr, prefix, 300*time.Millisecond, 2*time.Second, nil)
	w := join(t, b, "watcher", "r", true)
	w.untilDiff("r")
	for i := 0; i < 3; i++ {
		join(t, a, fmt.Sprintf("a%d", i), "r", false)
	}
	count := func() int {
		n, err := b.fan.PresenceCount(context.Background(), "test/r")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	checkFor(t, 5*time.Second, func() bool { return count() == 4 })
	// Every node's lease ends now: b reaps a (and a reaps b, or b itself
	// is told at its renewal); both apply their presence again. Two
	// renewals that meet in Redis (each node's renewal before the other's
	// look) take nobody out, rightly: the lease's end is set again then.
	nodes := prefix + ".pr.nodes"
	var sawLow bool
	for try := 0; try < 5 && !sawLow; try++ {
		for _, m := range strings.Fields(redistest.CLI(t, 6379, "zrange", nodes, "0", "-1")) {
			redistest.CLI(t, 6379, "zadd", nodes, "1", m)
		}
		for end := time.Now().Add(2 * time.Second); !sawLow && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			sawLow = count() < 4
		}
	}
	if !sawLow {
		t.Fatal("the lease's end took nobody out")
	}
	checkFor(t, 10*time.Second, func() bool { return count() == 4 })
}

// Joins spread over 3 s reach a subscriber in at most one presence_diff
// per second, every user once.
//
// The second is the node's, so it is checked on times the client's clock
// bounds safely whatever the load: a frame is sent no earlier than the
// join of each user in it was sent (minus the moment between the tick
// reading its clock and counting the joins), and read no earlier than it
// was sent. So a frame's read comes at least a second (less that slack)
// after the sending of the last join in the frame before it. A late read
// only lengthens that; a read-to-read gap, which a late read of the first
// frame shortens, is not used. Without coalescing the frames come a tick
// (200 ms) apart and this fails.
func TestPresenceCoalesced(t *testing.T) {
	const users = 30
	const every, slack = time.Second, 100 * time.Millisecond
	n := presenceNode(t, "", "", time.Second, 0, nil)
	watchSent := time.Now()
	w := join(t, n, "watcher", "r", true)
	w.untilDiff("r")
	conns := make([]*client, users)
	for i := range conns {
		conns[i] = n.dial(t, fmt.Sprintf("u%02d", i))
	}
	var mu sync.Mutex
	sent := make(map[string]time.Time, users) // just before each join was sent
	done := make(chan error, 1)
	go func() {
		for i, c := range conns {
			name := fmt.Sprintf("u%02d", i)
			mu.Lock()
			sent[name] = time.Now()
			mu.Unlock()
			if err := wsutil.WriteClientText(c.conn, []byte(`{"op":"join","room":"r"}`)); err != nil {
				done <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		done <- nil
	}()
	var joined []string
	lastSent := watchSent // of the frame before: the watcher's own
	end := time.Now().Add(30 * time.Second)
	for frame := 0; len(joined) < users; {
		m, ok := w.tryRecv(end)
		if !ok {
			t.Fatalf("%d of %d joined seen", len(joined), users)
		}
		if m["op"] != "presence_diff" {
			continue
		}
		read := time.Now()
		if gap := read.Sub(lastSent); gap < every-slack {
			t.Fatalf("frame %d read %v after the last join of the frame before was sent: not a second apart", frame, gap)
		}
		j := strs(m["joined"])
		mu.Lock()
		lastSent = time.Time{}
		for _, u := range j {
			if at, ok := sent[u]; !ok {
				t.Fatalf("frame %d: %q in it before its join was sent", frame, u)
			} else if at.After(lastSent) {
				lastSent = at
			}
		}
		mu.Unlock()
		if len(j) == 0 {
			t.Fatalf("frame %d: %v", frame, m)
		}
		joined = append(joined, j...)
		frame++
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sort.Strings(joined)
	for i, u := range joined {
		if u != fmt.Sprintf("u%02d", i) {
			t.Fatalf("joined %v", joined)
		}
	}
}

// With Redis an idle node's presence goroutine wakes for its lease only:
// one renewal per fifth of the lease (here 3 s: every 600 ms), where the
// old ticker woke every 200 ms, and the lease stays held.
func TestPresenceIdleRedisWakesForLease(t *testing.T) {
	redistest.Require(t)
	prefix := redistest.Prefix(t)
	n := presenceNode(t, redistest.Addr, prefix, 300*time.Millisecond, 3*time.Second, nil)
	w := join(t, n, "watcher", "r", true)
	w.untilDiff("r")
	time.Sleep(500 * time.Millisecond) // the diff's own ticks are through
	before, from := n.fan.Stats.PresenceWakes.Load(), time.Now()
	time.Sleep(3 * time.Second)
	got, idle := n.fan.Stats.PresenceWakes.Load()-before, time.Since(from)
	// One renewal per 600 ms of the time really counted (a slow machine
	// sleeps longer), one more for the grid. Fewer is a late timer, not
	// a wake too many: the lease's end below says whether renewals came.
	// The old ticker's 5 a second would be three times this.
	if most := uint64(idle/(600*time.Millisecond)) + 1; got < 2 || got > most {
		t.Fatalf("%d wake-ups in %v idle, want the lease's %d at most", got, idle, most)
	}
	t.Logf("%d wake-ups in %v idle", got, idle)
	end, err := strconv.ParseInt(strings.Fields(redistest.CLI(t, 6379, "zrange", prefix+".pr.nodes", "0", "-1", "withscores"))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	// Renewed every 600 ms, it has at least 2.4 s left, less the time
	// redis-cli took to answer; unrenewed in the idle 3.5 s, it ended.
	if left := time.Until(time.UnixMilli(end)); left < time.Second {
		t.Fatalf("the lease ends in %v: not renewed", left)
	}
}
