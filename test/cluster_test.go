package test

// Many nodes, end to end: real `roost serve` processes sharing one
// PostgreSQL database and one Redis (single or a three-shard Cluster), real
// WebSocket clients spread over them, and the faults the design calls for: a Redis
// restart during a publish burst and a node killed with SIGKILL.

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// fleet is a set of nodes with members spread over them.
type fleet struct {
	nodes   []*roostNode
	rooms   []string
	members []*wsClient
	homes   []int // node index of each member
	pubs    []*wsClient
}

// spread dials perNode members on every node; member g joins roomsEach
// consecutive rooms starting at g, so every room has members on every node
// when perNode + roomsEach - 1 >= nrooms.
func spread(t *testing.T, nodes []*roostNode, nrooms, perNode, roomsEach int) *fleet {
	t.Helper()
	f := &fleet{nodes: nodes}
	for r := range nrooms {
		f.rooms = append(f.rooms, "r"+strconv.Itoa(r))
	}
	for k, n := range nodes {
		for i := range perNode {
			g := k*perNode + i
			c := dialClient(t, n, fmt.Sprintf("m%d-%d", k, i))
			for j := range roomsEach {
				c.join(t, f.rooms[(g+j)%nrooms])
			}
			f.members = append(f.members, c)
			f.homes = append(f.homes, k)
		}
	}
	return f
}

// joinedRooms is the rooms c joined.
func (c *wsClient) joinedRooms() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.rooms...)
}

// publishers dials perNode publishers on every node (not members).
func (f *fleet) publishers(t *testing.T, perNode int) {
	t.Helper()
	for k, n := range f.nodes {
		for i := range perNode {
			f.pubs = append(f.pubs, dialClient(t, n, fmt.Sprintf("p%d-%d", k, i)))
		}
	}
}

// burst has every publisher publish per messages into every room,
// interleaved, and waits until all are acknowledged. during, if set, runs
// after delay while the burst goes on.
func (f *fleet) burst(t *testing.T, per, window int, pace time.Duration, delay time.Duration, during func()) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	errs := make([]error, len(f.pubs))
	var wg sync.WaitGroup
	for pi, p := range f.pubs {
		var jobs []pubJob
		for i := range per {
			for _, r := range f.rooms {
				jobs = append(jobs, pubJob{room: r, id: fmt.Sprintf("%s-%s-%d", p.user, r, i)})
			}
		}
		// Fail over to the other nodes, nearest first.
		home := pi / (len(f.pubs) / len(f.nodes))
		var failover []*roostNode
		for k := 1; k < len(f.nodes); k++ {
			failover = append(failover, f.nodes[(home+k)%len(f.nodes)])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[pi] = p.publishAll(jobs, window, pace, deadline, failover)
		}()
	}
	if during != nil {
		time.Sleep(delay)
		during()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// waitComplete waits until every member that is still connected has
// exactly 1..n[room] of each of its rooms. Members closed by the server
// are handled by onClosed (which must rejoin them) if set, else fail.
func (f *fleet) waitComplete(t *testing.T, n map[string]uint64, d time.Duration, onClosed func(i int, c *wsClient)) {
	t.Helper()
	redistest.WaitFor(t, d, func() error {
		for i, c := range f.members {
			if c.dead() {
				if onClosed == nil {
					c.mu.Lock()
					err := c.readErr
					c.mu.Unlock()
					return fmt.Errorf("member %s lost its connection: %v", c.user, err)
				}
				onClosed(i, c)
			}
			for _, r := range c.joinedRooms() {
				s := c.seqs(r)
				if err := checkSeqs(s, n[r]); err != nil {
					// A fault in what arrived is final; only "not yet" may wait.
					if !strings.HasPrefix(err.Error(), "received") {
						t.Fatalf("member %s on %s, room %s: %v", c.user, f.nodes[f.homes[i]].Name, r, err)
					}
					return fmt.Errorf("member %s room %s: %v", c.user, r, err)
				}
			}
		}
		return nil
	})
}

// acked returns each room's highest acknowledged seq, after checking the
// acks are exactly 1..n with no seq given twice.
func (f *fleet) acked(t *testing.T) map[string]uint64 {
	t.Helper()
	n := map[string]uint64{}
	for _, r := range f.rooms {
		n[r] = maxAck(f.pubs, r)
		if err := ackedSeqs(f.pubs, r, n[r]); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// roomSeq is the room's newest committed seq, as a fresh join reports it.
func (f *fleet) roomSeq(t *testing.T, n *roostNode, room string) uint64 {
	t.Helper()
	c := dialClient(t, n, "probe"+randHex(3))
	defer c.close()
	c.join(t, room)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.joined[room]
}

// counters sums metrics over the live nodes.
func (f *fleet) counters(t *testing.T, names ...string) []float64 {
	sums := make([]float64, len(names))
	for _, n := range f.nodes {
		if n.Alive() {
			m := n.Metrics(t)
			for i, name := range names {
				sums[i] += m[name]
			}
		}
	}
	return sums
}

func (f *fleet) gapCloses(t *testing.T) (repairs, closes float64) {
	s := f.counters(t, "roost_gap_repairs_total", "roost_gap_closes_total")
	return s[0], s[1]
}

// fanOutOrder is test 2 and 3: three nodes, six rooms with members on
// every node, publishers on every node, pipelined so that commits of one
// room by different nodes reach each node in any order.
func fanOutOrder(t *testing.T, e *env, subscribers func(room string) (int, error)) {
	nodes := startNodes(t, e, 3)
	const nrooms, perNode, roomsEach = 6, 4, 3
	f := spread(t, nodes, nrooms, perNode, roomsEach)
	f.publishers(t, 2)

	// Operators see where the clients are: every node holds its own
	// members and publishers and every room.
	redistest.WaitFor(t, 5*time.Second, func() error {
		for _, n := range nodes {
			if h := n.Health(t); h.Conns != perNode+2 || h.Rooms != nrooms {
				return fmt.Errorf("%s /healthz: conns=%d rooms=%d, want %d and %d", n.Name, h.Conns, h.Rooms, perNode+2, nrooms)
			}
		}
		return nil
	})
	// ... how many members it holds and what it subscribed on Redis.
	redistest.WaitFor(t, 5*time.Second, func() error {
		for _, n := range nodes {
			m := n.Metrics(t)
			if m["roost_room_memberships"] != perNode*roomsEach || m["roost_redis_subscribed_rooms"] != nrooms || m["roost_redis_pending_rooms"] != 0 {
				return fmt.Errorf("%s: memberships %v subscribed %v pending %v, want %d, %d, 0", n.Name,
					m["roost_room_memberships"], m["roost_redis_subscribed_rooms"], m["roost_redis_pending_rooms"], perNode*roomsEach, nrooms)
			}
		}
		return nil
	})
	// Every node subscribed every room once.
	for _, r := range f.rooms {
		if got, err := subscribers(r); err != nil || got != len(nodes) {
			t.Fatalf("room %s: %d nodes subscribed (%v), want %d", r, got, err, len(nodes))
		}
	}

	const per = 20
	start := time.Now()
	f.burst(t, per, 16, 0, 0, nil)
	n := f.acked(t)
	for _, r := range f.rooms {
		if want := uint64(per * len(f.pubs)); n[r] != want {
			t.Fatalf("room %s: newest ack %d, want %d", r, n[r], want)
		}
	}
	f.waitComplete(t, n, 15*time.Second, nil)
	repairs, closes := f.gapCloses(t)
	t.Logf("%d messages in %d rooms to %d members on %d nodes in %s; store repairs %v",
		per*len(f.pubs)*nrooms, nrooms, len(f.members), len(nodes), time.Since(start).Round(time.Millisecond), repairs)
	if closes != 0 {
		t.Fatalf("%v members closed for gaps the store could not fill", closes)
	}

	// The last local member leaving unsubscribes the node: node0 loses
	// all its members, the others keep theirs.
	for i, c := range f.members {
		if f.homes[i] == 0 {
			c.close()
		}
	}
	redistest.WaitFor(t, 5*time.Second, func() error {
		if h := nodes[0].Health(t); h.Rooms != 0 {
			return fmt.Errorf("node0 still holds %d rooms", h.Rooms)
		}
		for _, r := range f.rooms {
			if got, err := subscribers(r); err != nil || got != len(nodes)-1 {
				return fmt.Errorf("room %s: %d nodes subscribed (%v), want %d", r, got, err, len(nodes)-1)
			}
		}
		return nil
	})
}

// Test 2: three nodes on one Redis.
func TestMultiNodeFanOutOrder(t *testing.T) {
	redistest.Require(t)
	redistest.RequireBinaries(t)
	e := newEnv(t, redistest.Addr)
	fanOutOrder(t, e, func(room string) (int, error) {
		out := strings.Fields(redistest.CLI(t, 6379, "pubsub", "numsub", e.channel(room)))
		if len(out) != 2 {
			return 0, fmt.Errorf("pubsub numsub answered %q", out)
		}
		return strconv.Atoi(out[1])
	})
}

// Test 3: the same on a three-shard Redis Cluster (sharded pub/sub); the
// rooms land on more than one shard.
func TestMultiNodeRedisCluster(t *testing.T) {
	shards := redistest.StartCluster(t)
	var seeds []string
	for _, s := range shards {
		seeds = append(seeds, s.Addr())
	}
	e := newEnv(t, strings.Join(seeds, ","))
	owners := map[int]bool{}
	fanOutOrder(t, e, func(room string) (int, error) {
		ch := e.channel(room)
		for _, s := range shards {
			out := strings.Fields(redistest.CLI(t, s.Port, "pubsub", "shardchannels", e.prefix+".*"))
			if !slices.Contains(out, ch) {
				continue
			}
			owners[s.Port] = true
			// SHARDNUMSUB is answered by the shard owning the channel.
			num := strings.Fields(redistest.CLI(t, s.Port, "pubsub", "shardnumsub", ch))
			if len(num) != 2 {
				return 0, fmt.Errorf("pubsub shardnumsub answered %q", num)
			}
			return strconv.Atoi(num[1])
		}
		return 0, nil
	})
	if len(owners) < 2 {
		t.Fatalf("six rooms landed on %d shard(s), want them spread", len(owners))
	}
	t.Logf("rooms spread over %d of %d shards", len(owners), len(shards))
}

// Test 4: Redis is killed (kill -9) during a publish burst and restarted
// on the same port. Publishes keep committing to PostgreSQL meanwhile; the
// nodes resubscribe and repair from the store. Every member that stayed
// connected gets 1..N; a member closed with 1013 rejoins with since and
// gets 1..N; nobody ever sees a gap or a duplicate.
func TestMultiNodeRedisRestart(t *testing.T) {
	redistest.RequireBinaries(t)
	rp := redistest.Start(t, redistest.FreePort(t, false))
	e := newEnv(t, rp.Addr())
	nodes := startNodes(t, e, 3)
	f := spread(t, nodes, 3, 3, 2)
	f.publishers(t, 1)

	f.burst(t, 120, 8, 3*time.Millisecond, 400*time.Millisecond, func() {
		rp.Kill()
		time.Sleep(700 * time.Millisecond)
		rp.Restart(t)
	})
	n := f.acked(t)
	rejoined := 0
	f.waitComplete(t, n, 20*time.Second, func(i int, c *wsClient) {
		c.mu.Lock()
		code := c.closeCode
		c.mu.Unlock()
		if code != 1013 {
			t.Fatalf("member %s lost its connection without 1013 (close code %d)", c.user, code)
		}
		rejoined++
		c.rejoin(t, nodes[f.homes[i]])
	})
	c := f.counters(t, "roost_broker_errors_total", "roost_gap_repairs_total", "roost_gap_closes_total")
	t.Logf("after the Redis restart: %v publishes not broadcast, %v gap repairs, %v gap closes, %d members rejoined with since", c[0], c[1], c[2], rejoined)
	if c[0] == 0 {
		t.Fatal("no publish failed: the outage missed the burst, the test proved nothing")
	}
	// Each node resubscribed by itself and reports nothing pending.
	for _, n := range nodes {
		m := n.Metrics(t)
		if m["roost_redis_resubscribes_total"] < 1 || m["roost_redis_pending_rooms"] != 0 {
			t.Fatalf("%s after the restart: resubscribes %v pending %v", n.Name, m["roost_redis_resubscribes_total"], m["roost_redis_pending_rooms"])
		}
	}
	for _, r := range f.rooms {
		if got := f.roomSeq(t, nodes[0], r); got != n[r] {
			t.Fatalf("room %s: store has %d messages, %d acknowledged", r, got, n[r])
		}
	}
}

// Test 5: a node is killed (SIGKILL) during a publish burst. Its members
// reconnect to the next node with since and miss nothing; its publisher
// re-sends what was unacknowledged elsewhere under the same ids; members
// of the other nodes are not disturbed.
func TestMultiNodeKillNode(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	nodes := startNodes(t, e, 3)
	f := spread(t, nodes, 3, 3, 2)
	f.publishers(t, 1)

	const victim = 2
	var wg sync.WaitGroup
	rejoinErrs := make(chan error, len(f.members))
	f.burst(t, 100, 8, 3*time.Millisecond, 400*time.Millisecond, func() {
		nodes[victim].Kill()
		for i, c := range f.members {
			if f.homes[i] != victim {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-c.done
				if err := c.rejoinErr(nodes[(victim+1)%len(nodes)]); err != nil {
					rejoinErrs <- err
				}
			}()
		}
	})
	wg.Wait()
	close(rejoinErrs)
	for err := range rejoinErrs {
		t.Fatal(err)
	}
	n := f.acked(t)
	// Every id was acknowledged, re-sends included, so nothing committed
	// is unacknowledged: the store holds exactly the acknowledged seqs.
	for _, r := range f.rooms {
		if got := f.roomSeq(t, nodes[0], r); got != n[r] {
			t.Fatalf("room %s: store has %d messages, %d acknowledged", r, got, n[r])
		}
	}
	f.waitComplete(t, n, 15*time.Second, nil)
	for i, c := range f.members {
		c.mu.Lock()
		closes := len(c.closes)
		c.mu.Unlock()
		if f.homes[i] != victim && closes != 0 {
			t.Fatalf("member %s of a surviving node was closed", c.user)
		}
	}
	repairs, _ := f.gapCloses(t)
	t.Logf("node%d killed mid-burst: its members rejoined node%d with since; %d store repairs on the survivors", victim, (victim+1)%len(nodes), int(repairs))
}

// A Redis restart on a node holding thousands of rooms: the node must
// read every room's tail from the store after resubscribing, without
// losing any room to a full read queue. One member joins all rooms; the
// publisher's messages are committed while Redis is down, so the member
// can only get them from the store.
func TestRedisRestartManyRooms(t *testing.T) {
	redistest.RequireBinaries(t)
	rp := redistest.Start(t, redistest.FreePort(t, false))
	e := newEnv(t, rp.Addr())
	const nrooms = 5000
	nodes := startNodes(t, e, 1, "--max-rooms", strconv.Itoa(nrooms))
	m := dialClient(t, nodes[0], "member")
	rooms := make([]string, nrooms)
	for i := range rooms {
		rooms[i] = "big" + strconv.Itoa(i)
	}
	// Joins go in windows: a join is a subscription plus a store read, and
	// the node refuses (err overloaded) what its read queue cannot hold.
	for lo := 0; lo < nrooms; lo += 250 {
		hi := min(lo+250, nrooms)
		m.mu.Lock()
		m.rooms = append(m.rooms, rooms[lo:hi]...)
		m.mu.Unlock()
		for _, r := range rooms[lo:hi] {
			if err := m.send(`{"op":"join","room":"` + r + `"}`); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range rooms[lo:hi] {
			m.waitJoined(t, r)
		}
	}
	if h := nodes[0].Health(t); h.Rooms != nrooms {
		t.Fatalf("node holds %d rooms, want %d", h.Rooms, nrooms)
	}

	rp.Kill()
	p := dialClient(t, nodes[0], "publisher")
	var jobs []pubJob
	for _, r := range rooms {
		jobs = append(jobs, pubJob{room: r, id: "lost-" + r})
	}
	if err := p.publishAll(jobs, 256, 0, time.Now().Add(20*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	rp.Restart(t)
	missing := func() []string {
		var miss []string
		for _, r := range rooms {
			if s := m.seqs(r); len(s) != 1 || s[0] != 1 {
				miss = append(miss, r)
			}
		}
		return miss
	}
	redistest.WaitFor(t, 15*time.Second, func() error {
		if miss := missing(); len(miss) > 0 {
			return fmt.Errorf("%d of %d rooms never got their message committed during the outage (e.g. %s)", len(miss), nrooms, miss[0])
		}
		return nil
	})
}

// envInt reads a benchmark knob from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkCrossNodeLatency measures what crossing nodes adds to delivery
// latency: publishers on node0, one room with the same number of members
// on node0 (same node as the publisher) and on node1 (cross-node), so both
// groups see the same messages at the same moment through the same Redis.
// Latency is publish send time to receipt, one clock (this process).
// Knobs (environment): ROOST_XNODE_RATE publishes/s (default 100),
// ROOST_XNODE_MEMBERS per node (default 200), ROOST_XNODE_SECONDS measured
// (default 10, at most 50) after a 2 s warm-up; ROOST_NODE_CPU_QUOTA caps
// each node's CPU (see cpuGroup). Run it with -benchtime=1x.
func BenchmarkCrossNodeLatency(b *testing.B) {
	redistest.Require(b)
	rate := envInt("ROOST_XNODE_RATE", 100)
	perNode := envInt("ROOST_XNODE_MEMBERS", 200)
	secs := min(envInt("ROOST_XNODE_SECONDS", 10), 50)
	e := newEnv(b, redistest.Addr)
	// Production's flush tick, not the tests' 1 ms.
	nodes := startNodes(b, e, 2, "--flush", "5ms")
	const room = "lat"
	groups := [2][]*wsClient{}
	for k, n := range nodes {
		for i := range perNode {
			c := dialClient(b, n, fmt.Sprintf("m%d-%d", k, i))
			c.fast = room
			c.join(b, room)
			groups[k] = append(groups[k], c)
		}
	}
	var pubs []*wsClient
	for i := range 4 {
		pubs = append(pubs, dialClient(b, nodes[0], fmt.Sprintf("p%d", i)))
	}
	warm := 2 * time.Second
	start := time.Now()
	from := start.Add(warm).UnixNano()
	for _, g := range groups {
		for _, c := range g {
			c.mu.Lock()
			c.latFrom = from
			c.mu.Unlock()
		}
	}
	b.ResetTimer()
	var cpu0 [2]time.Duration
	marked, sent := false, 0
	tick := time.Second / time.Duration(rate)
	end := start.Add(warm + time.Duration(secs)*time.Second)
	for next := start; next.Before(end); next = next.Add(tick) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		if !marked && time.Now().UnixNano() >= from {
			marked = true
			for k, n := range nodes {
				cpu0[k] = n.CPUTime()
			}
		}
		p := pubs[sent%len(pubs)]
		if err := p.send(fmt.Sprintf(`{"op":"pub","room":%q,"id":"x%d","body":{"t":%d}}`, room, sent, time.Now().UnixNano())); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	var share [2]float64
	for k, n := range nodes {
		share[k] = (n.CPUTime() - cpu0[k]).Seconds() / time.Since(time.Unix(0, from)).Seconds()
	}
	// Every member gets every message: 1..sent, no gap, no duplicate.
	redistest.WaitFor(b, 30*time.Second, func() error {
		for _, g := range groups {
			for _, c := range g {
				if err := checkSeqs(c.seqs(room), uint64(sent)); err != nil {
					return fmt.Errorf("%s: %v", c.user, err)
				}
			}
		}
		return nil
	})
	b.StopTimer()
	var pct [2][3]time.Duration
	for k, g := range groups {
		var all []time.Duration
		for _, c := range g {
			c.mu.Lock()
			all = append(all, c.lat...)
			c.mu.Unlock()
		}
		slices.Sort(all)
		q := func(x float64) time.Duration { return all[min(len(all)-1, int(x*float64(len(all))))] }
		pct[k] = [3]time.Duration{q(0.5), q(0.99), q(0.999)}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(float64(rate*perNode*2), "frames/s")
	b.ReportMetric(ms(pct[0][0]), "same-p50-ms")
	b.ReportMetric(ms(pct[0][1]), "same-p99-ms")
	b.ReportMetric(ms(pct[1][0]), "cross-p50-ms")
	b.ReportMetric(ms(pct[1][1]), "cross-p99-ms")
	b.ReportMetric(ms(pct[1][1]-pct[0][1]), "added-p99-ms")
	b.ReportMetric(share[0]*100, "node0-cpu-%")
	b.ReportMetric(share[1]*100, "node1-cpu-%")
	b.Logf("%d publishes/s for %ds to %d+%d members: same-node p50 %v p99 %v p999 %v; cross-node p50 %v p99 %v p999 %v; node CPU %.1f%% / %.1f%%",
		rate, secs, perNode, perNode, pct[0][0], pct[0][1], pct[0][2], pct[1][0], pct[1][1], pct[1][2], share[0]*100, share[1]*100)
}
