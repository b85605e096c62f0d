package loop

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// joinAll joins every client to room and waits for each joined.
func joinAll(room string, cs ...*client) {
	for _, c := range cs {
		c.send(`{"op":"join","room":"` + room + `"}`)
		c.expect(map[string]any{"op": "joined", "room": room})
	}
}

// A signal reaches the room's other connections, the sender's user's other
// tabs included, but not the sending connection; it is not stored: the next
// message is seq 1, and history holds only that.
func TestSignalReachesOthersNotStored(t *testing.T) {
	n := startNode(t, nil)
	a1, a2, bob := n.dial(t, "alice"), n.dial(t, "alice"), n.dial(t, "bob")
	joinAll("r", a1, a2, bob)
	a1.send(`{"op":"signal","room":"r","body":{"typing":true}}`)
	want := `{"op":"signal","room":"r","from":"alice","body":{"typing":true}}`
	for _, c := range []*client{bob, a2} {
		if got := string(c.recvRaw()); got != want {
			t.Fatalf("signal frame %s, want %s", got, want)
		}
	}
	// The sender's next frame is the answer to its ping: it got no signal.
	a1.send(`{"op":"ping"}`)
	a1.expect(map[string]any{"op": "pong"})

	bob.send(`{"op":"pub","room":"r","id":"m1","body":1}`)
	for _, c := range []*client{a1, a2} {
		c.expect(map[string]any{"op": "msg", "seq": 1})
	}
	a1.send(`{"op":"history","room":"r"}`)
	h := a1.expect(map[string]any{"op": "history"})
	if msgs, _ := h["messages"].([]any); len(msgs) != 1 {
		t.Fatalf("history holds %d messages, want the one msg: %v", len(msgs), h)
	}
	if got := n.fan.Stats.SignalsSent.Load(); got != 2 {
		t.Fatalf("signals sent %d, want 2", got)
	}
}

// Bad signals are answered with an err whose ref is the room, and cost
// nobody else anything.
func TestSignalBadInput(t *testing.T) {
	n := startNode(t, func(c *Config) { c.SignalRate, c.SignalBurst = 1, 2 })
	a, bob := n.dial(t, "alice"), n.dial(t, "bob")
	joinAll("r", a, bob)
	a.send(`{"op":"signal","room":"r","body":"` + strings.Repeat("x", 1023) + `"}`)
	a.expect(map[string]any{"op": "err", "code": "too_large", "ref": "r"})
	a.send(`{"op":"signal","room":"r"}`)
	a.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "r"})
	a.send(`{"op":"signal","body":1}`)
	a.expect(map[string]any{"op": "err", "code": "bad_request"})
	a.send(`{"op":"signal","room":"r","id":"x","body":"` + strings.Repeat("x", 2000) + `"}`)
	a.expect(map[string]any{"op": "err", "code": "too_large", "ref": "r"})
	for i := 0; i < 2; i++ { // the burst
		a.send(fmt.Sprintf(`{"op":"signal","room":"r","body":%d}`, i))
		bob.expect(map[string]any{"op": "signal", "body": i, "from": "alice"})
	}
	a.send(`{"op":"signal","room":"r","body":3}`)
	got := a.expect(map[string]any{"op": "err", "code": "rate_limited", "ref": "r"})
	if num(got["retry_after"]) < 1 {
		t.Fatalf("rate_limited without retry_after: %v", got)
	}
	if n.fan.Stats.SignalsLimited.Load() != 1 {
		t.Fatalf("signals limited %d, want 1", n.fan.Stats.SignalsLimited.Load())
	}
	// Bob is unaffected: his publish goes through.
	bob.send(`{"op":"pub","room":"r","id":"k","body":1}`)
	for f := bob.recv(); f["op"] != "ack"; f = bob.recv() {
	}
}

// An SSE listener gets a signal as "event: signal" without moving its
// position (no id line).
func TestSignalSSE(t *testing.T) {
	n := startNode(t, nil)
	s := n.sse(t, "user=bob&app=test&room=r")
	s.expect("joined")
	id := s.lastID
	a := n.dial(t, "alice")
	joinAll("r", a)
	a.send(`{"op":"signal","room":"r","body":"hi"}`)
	ev := s.expect("signal")
	if ev.data != `{"op":"signal","room":"r","from":"alice","body":"hi"}` || s.lastID != id {
		t.Fatalf("signal event %+v, id %q (was %q)", ev, s.lastID, id)
	}
}

// Two nodes over Redis: a signal reaches members on both, the sender's
// other tab on its own node included, the sender not.
func TestSignalTwoNodesRedis(t *testing.T) {
	a, b, _, _ := pgRedisNodes(t)
	a1, a2, bobB, aliceB := a.dial(t, "alice"), a.dial(t, "alice"), b.dial(t, "bob"), b.dial(t, "alice")
	joinAll("r", a1, a2, bobB, aliceB)
	a1.send(`{"op":"signal","room":"r","body":{"typing":true}}`)
	want := `{"op":"signal","room":"r","from":"alice","body":{"typing":true}}`
	for _, c := range []*client{a2, bobB, aliceB} {
		if got := string(c.recvRaw()); got != want {
			t.Fatalf("signal frame %s, want %s", got, want)
		}
	}
	a1.send(`{"op":"ping"}`)
	a1.expect(map[string]any{"op": "pong"})
	// Nothing reached the store: the first message is seq 1 on both.
	bobB.send(`{"op":"pub","room":"r","id":"m1","body":1}`)
	a1.expect(map[string]any{"op": "msg", "seq": 1})
}

// Echo off: the publisher's connection gets acks with the seq but not its
// own msg frames in that room; its other tab and other users get them, and
// it still gets the others' messages, whichever comes first of a msg and
// its ack.
func TestEchoOff(t *testing.T) {
	n := startNode(t, nil)
	a1, a2, bob := n.dial(t, "alice"), n.dial(t, "alice"), n.dial(t, "bob")
	a1.send(`{"op":"join","room":"r","echo":false}`)
	a1.expect(map[string]any{"op": "joined", "room": "r"})
	joinAll("r", a2, bob)
	for i := 1; i <= 20; i++ {
		a1.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i))
	}
	for i := 1; i <= 20; i++ {
		a1.expect(map[string]any{"op": "ack", "id": fmt.Sprintf("m%d", i), "seq": i})
	}
	bob.send(`{"op":"pub","room":"r","id":"m1","body":0}`) // same id, another user
	a1.expect(map[string]any{"op": "msg", "seq": 21, "from": "bob"})
	for _, c := range []*client{a2, bob} {
		c.expectSeqs("r", 1, 20)
	}
	// A repeated publish is acked with the first seq and delivers nothing;
	// the next message still reaches a1 only if it is not its own.
	a1.send(`{"op":"pub","room":"r","id":"m3","body":3}`)
	a1.expect(map[string]any{"op": "ack", "id": "m3", "seq": 3})
	a1.send(`{"op":"pub","room":"r","id":"x","body":0}`)
	a1.expect(map[string]any{"op": "ack", "id": "x", "seq": 22})
	bob.send(`{"op":"pub","room":"r","id":"y","body":0}`)
	a1.expect(map[string]any{"op": "msg", "seq": 23, "from": "bob"})
	// Joined again with echo, it gets its own messages again.
	a1.send(`{"op":"leave","room":"r"}`)
	a1.expect(map[string]any{"op": "left"})
	a1.send(`{"op":"join","room":"r"}`)
	a1.expect(map[string]any{"op": "joined"})
	a1.send(`{"op":"pub","room":"r","id":"z","body":0}`)
	if f := a1.recv(); f["op"] == "ack" {
		a1.expect(map[string]any{"op": "msg", "seq": 24})
	} else if f["op"] != "msg" || num(f["seq"]) != 24 {
		t.Fatalf("want own msg back, got %v", f)
	}
}

// Echo off across nodes: with Redis the ack usually comes before the msg.
func TestEchoOffRedis(t *testing.T) {
	redistest.Require(t)
	prefix := redistest.Prefix(t)
	mem := persist.NewMemory(1000)
	a := startNodeWith(t, testConfig(), mem, testLogger(), redisBroker(t, redistest.Addr, prefix))
	a1, bob := a.dial(t, "alice"), a.dial(t, "bob")
	a1.send(`{"op":"join","room":"r","echo":false}`)
	a1.expect(map[string]any{"op": "joined", "room": "r"})
	joinAll("r", bob)
	for i := 1; i <= 10; i++ {
		a1.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i))
		a1.expect(map[string]any{"op": "ack", "seq": i})
	}
	bob.expectSeqs("r", 1, 10)
	bob.send(`{"op":"pub","room":"r","id":"b","body":0}`)
	a1.expect(map[string]any{"op": "msg", "seq": 11, "from": "bob"})
}

// An inbox is joined by its own user only, whatever the token's rooms,
// and written by no client.
func TestInboxRules(t *testing.T) {
	n := startNode(t, nil)
	alice, bob := n.dial(t, "alice"), n.dial(t, "bob")
	alice.send(`{"op":"join","room":"@alice"}`)
	alice.expect(map[string]any{"op": "joined", "room": "@alice", "seq": 0})
	bob.send(`{"op":"join","room":"@alice"}`)
	bob.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "@alice"})
	bob.send(`{"op":"history","room":"@alice"}`)
	bob.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "@alice"})
	for _, c := range []*client{alice, bob} {
		c.send(`{"op":"pub","room":"@alice","id":"k","body":1}`)
		c.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "k"})
		c.send(`{"op":"signal","room":"@alice","body":1}`)
		c.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "@alice"})
	}
	alice.send(`{"op":"join","room":"@"}`)
	alice.expect(map[string]any{"op": "err", "code": "bad_request"})
	s := n.sse(t, "user=bob&app=test&room=%40alice")
	if s.status != 403 {
		t.Fatalf("SSE of another's inbox: %d", s.status)
	}
}

// In token mode too, the token's rooms do not matter for the own inbox.
func TestInboxWithTokenRooms(t *testing.T) {
	n := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"test": []byte("0123456789abcdef0123456789abcdef")}
	})
	tok := signToken([]byte("0123456789abcdef0123456789abcdef"), "test", "alice", time.Now().Add(time.Hour), []string{"lobby"})
	alice := n.dialQuery(t, "token="+tok)
	alice.send(`{"op":"join","room":"@alice"}`)
	alice.expect(map[string]any{"op": "joined", "room": "@alice"})
	alice.send(`{"op":"join","room":"@bob"}`)
	alice.expect(map[string]any{"op": "err", "code": "forbidden"})
	alice.send(`{"op":"join","room":"other"}`)
	alice.expect(map[string]any{"op": "err", "code": "forbidden"})
}

// skipTo reads frames until one with op, and returns it.
func (c *client) skipTo(op string) map[string]any {
	c.t.Helper()
	for {
		if f := c.recv(); f["op"] == op {
			return f
		}
	}
}

// Read positions: monotonic, checked against the room's newest seq,
// answered to every connection of the user, moved by the user's own pub.
func TestReadPositions(t *testing.T) {
	n := startNode(t, nil)
	a1, a2, bob := n.dial(t, "alice"), n.dial(t, "alice"), n.dial(t, "bob")
	publish(t, bob, "r", "m", 3)
	a1.send(`{"op":"read","room":"r","seq":2}`)
	a1.expect(map[string]any{"op": "read", "room": "r", "seq": 2})
	a2.expect(map[string]any{"op": "read", "room": "r", "seq": 2}) // the other tab
	a1.send(`{"op":"read","room":"r","seq":1}`)
	a1.expect(map[string]any{"op": "read", "room": "r", "seq": 2}) // never back
	a1.send(`{"op":"read","room":"r","seq":4}`)
	a1.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "r"})
	a1.send(`{"op":"read","room":"r","seq":1.5}`)
	a1.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "r"})
	a1.send(`{"op":"read","room":"r","seq":"3"}`)
	a1.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "r"})
	a1.send(`{"op":"read","room":"r"}`)
	a1.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "r"})
	a1.send(`{"op":"read","room":"@bob","seq":0}`)
	a1.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "@bob"})
	// Bob's own publishes moved his position.
	bob.send(`{"op":"read","room":"r","seq":0}`)
	bob.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	// So do alice's.
	a1.send(`{"op":"pub","room":"r","id":"own","body":1}`)
	a1.expect(map[string]any{"op": "ack", "seq": 4})
	a1.send(`{"op":"read","room":"r","seq":0}`)
	a1.expect(map[string]any{"op": "read", "room": "r", "seq": 4})
}

// Two nodes on PostgreSQL and Redis: a read reaches the user's tab on the
// other node, and the position survives the nodes (a node started later
// reads it from the database).
func TestReadPositionsTwoNodesPostgres(t *testing.T) {
	a, b, url, prefix := pgRedisNodes(t)
	bob := a.dial(t, "bob")
	publish(t, bob, "r", "m", 5)
	aliceA, aliceB := a.dial(t, "alice"), b.dial(t, "alice")
	aliceA.send(`{"op":"read","room":"r","seq":3}`)
	aliceA.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	aliceB.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	aliceB.send(`{"op":"read","room":"r","seq":2}`)
	aliceB.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	checkFor(t, 5*time.Second, func() bool { return a.fan.Stats.ReadMarksWritten.Load() >= 1 })

	pgC := openPG(t, url)
	t.Cleanup(pgC.Close)
	c := startNodeWith(t, testConfig(), pgC, testLogger(), redisBroker(t, redistest.Addr, prefix))
	aliceC := c.dial(t, "alice")
	aliceC.send(`{"op":"read","room":"r","seq":0}`)
	aliceC.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	// Bob's own publishes were written too.
	checkFor(t, 5*time.Second, func() bool {
		p, err := readPosition(pgC, "test/r", "bob")
		return err == nil && p == 5
	})
}

// Unread counts follow publishes and reads, against a model.
func TestUnreadCounts(t *testing.T) {
	n := startNode(t, nil)
	alice, bob := n.dial(t, "alice"), n.dial(t, "bob")
	publish(t, bob, "a", "m", 5)
	publish(t, bob, "b", "m", 2)
	alice.send(`{"op":"read","room":"a","seq":3}`)
	alice.expect(map[string]any{"op": "read", "seq": 3})
	alice.send(`{"op":"unread","rooms":["a","b","c"]}`)
	if got := string(alice.recvRaw()); got != `{"op":"unread","rooms":{"a":{"read":3,"seq":5,"count":2},"b":{"read":0,"seq":2,"count":2},"c":{"read":0,"seq":0,"count":0}}}` {
		t.Fatal(got)
	}
	alice.send(`{"op":"pub","room":"b","id":"x","body":1}`) // her own: read up to it
	alice.expect(map[string]any{"op": "ack", "seq": 3})
	alice.send(`{"op":"unread","rooms":["b"]}`)
	if got := string(alice.recvRaw()); got != `{"op":"unread","rooms":{"b":{"read":3,"seq":3,"count":0}}}` {
		t.Fatal(got)
	}
	many := `"r"` + strings.Repeat(`,"r"`, 100)
	alice.send(`{"op":"unread","rooms":[` + many + `]}`)
	alice.expect(map[string]any{"op": "err", "code": "bad_request"})
	alice.send(`{"op":"unread","rooms":["a","@bob"]}`)
	alice.expect(map[string]any{"op": "err", "code": "forbidden", "ref": ""})
}

// Unread counts on PostgreSQL match a model after random publishes and
// reads by several users, across two nodes.
func TestUnreadModelPostgres(t *testing.T) {
	a, b, _, _ := pgRedisNodes(t)
	rng := rand.New(rand.NewPCG(26, 1))
	users := []string{"u0", "u1", "u2"}
	rooms := []string{"r0", "r1", "r2", "r3"}
	conns := map[string]*client{}
	for i, u := range users {
		nd := a
		if i%2 == 1 {
			nd = b
		}
		conns[u] = nd.dial(t, u)
	}
	last := map[string]uint64{}
	read := map[string]uint64{} // user/room
	for step := 0; step < 120; step++ {
		u, r := users[rng.IntN(len(users))], rooms[rng.IntN(len(rooms))]
		c := conns[u]
		if rng.IntN(3) > 0 {
			c.send(fmt.Sprintf(`{"op":"pub","room":"%s","id":"s%d","body":%d}`, r, step, step))
			f := c.skipTo("ack")
			last[r] = num(f["seq"])
			read[u+"/"+r] = last[r]
			continue
		}
		seq := uint64(rng.IntN(int(last[r]) + 1))
		c.send(fmt.Sprintf(`{"op":"read","room":"%s","seq":%d}`, r, seq))
		f := c.skipTo("read")
		read[u+"/"+r] = max(read[u+"/"+r], seq)
		if num(f["seq"]) != read[u+"/"+r] {
			t.Fatalf("step %d: read %s %s answered %v, model %d", step, u, r, f["seq"], read[u+"/"+r])
		}
	}
	for _, u := range users {
		c := conns[u]
		c.send(`{"op":"unread","rooms":["r0","r1","r2","r3"]}`)
		f := c.skipTo("unread")
		got, _ := f["rooms"].(map[string]any)
		for _, r := range rooms {
			e, _ := got[r].(map[string]any)
			want := last[r] - read[u+"/"+r]
			if num(e["count"]) != want || num(e["seq"]) != last[r] || num(e["read"]) != read[u+"/"+r] {
				t.Fatalf("%s in %s: %v, model read %d seq %d count %d", u, r, e, read[u+"/"+r], last[r], want)
			}
		}
	}
}

// Receipts: a join with receipts gets the moved positions, at most once a
// second per room; the receipts query lists every position, newest first.
func TestReceipts(t *testing.T) {
	n := startNode(t, nil)
	alice, bob, carol := n.dial(t, "alice"), n.dial(t, "bob"), n.dial(t, "carol")
	alice.send(`{"op":"join","room":"r","receipts":true}`)
	alice.expect(map[string]any{"op": "joined"})
	publish(t, carol, "r", "m", 3)
	alice.expectSeqs("r", 1, 3)
	bob.send(`{"op":"read","room":"r","seq":2}`)
	bob.expect(map[string]any{"op": "read", "seq": 2})
	carol.send(`{"op":"read","room":"r","seq":3}`)
	carol.expect(map[string]any{"op": "read", "seq": 3}) // her own publishes had moved it: no news
	if got := string(alice.recvRaw()); got != `{"op":"receipts","room":"r","read":{"bob":2}}` {
		t.Fatal(got)
	}
	alice.send(`{"op":"receipts","room":"r"}`)
	if got := string(alice.recvRaw()); got != `{"op":"receipts","room":"r","read":{"carol":3,"bob":2}}` {
		t.Fatal(got)
	}
	bob.send(`{"op":"receipts","room":"@alice"}`)
	bob.expect(map[string]any{"op": "err", "code": "forbidden"})
	alice.send(`{"op":"join","room":"x","receipts":1}`)
	alice.expect(map[string]any{"op": "err", "code": "bad_request"})
}

// Receipts across nodes (PostgreSQL, Redis): a read on one node reaches
// the receipts subscriber on the other.
func TestReceiptsTwoNodesPostgres(t *testing.T) {
	a, b, _, _ := pgRedisNodes(t)
	alice, bob := a.dial(t, "alice"), b.dial(t, "bob")
	alice.send(`{"op":"join","room":"r","receipts":true}`)
	alice.expect(map[string]any{"op": "joined"})
	publish(t, bob, "r", "m", 2)
	alice.expectSeqs("r", 1, 2)
	bob.send(`{"op":"read","room":"r","seq":1}`)
	bob.expect(map[string]any{"op": "read", "seq": 2}) // his own publishes moved it
	alice.send(`{"op":"read","room":"r","seq":2}`)
	alice.expect(map[string]any{"op": "read", "seq": 2})
	carol := b.dial(t, "carol")
	carol.send(`{"op":"read","room":"r","seq":2}`)
	carol.expect(map[string]any{"op": "read", "seq": 2})
	// alice's own mark is news too; carol's came from the other node.
	if got := string(alice.recvRaw()); got != `{"op":"receipts","room":"r","read":{"alice":2,"carol":2}}` {
		t.Fatal(got)
	}
	// Asked at once, before node b has written carol's mark: the answer
	// holds what the receipts frame already told (bob's move by his own
	// publish is announced within a second, so it may not be there yet).
	alice.send(`{"op":"receipts","room":"r"}`)
	if got := string(alice.recvRaw()); got != `{"op":"receipts","room":"r","read":{"alice":2,"carol":2}}` &&
		got != `{"op":"receipts","room":"r","read":{"alice":2,"bob":2,"carol":2}}` {
		t.Fatal("before the write:", got)
	}
	checkFor(t, 5*time.Second, func() bool { return b.fan.Stats.ReadMarksWritten.Load() >= 2 })
	alice.send(`{"op":"receipts","room":"r"}`)
	if got := string(alice.recvRaw()); got != `{"op":"receipts","room":"r","read":{"alice":2,"bob":2,"carol":2}}` {
		t.Fatal(got)
	}
}

// pgRedisNodes starts two nodes on one PostgreSQL database and one Redis
// prefix, which it returns for more nodes.
func pgRedisNodes(t *testing.T) (a, b *node, url, prefix string) {
	t.Helper()
	redistest.Require(t)
	url = pgtest.NewDB(t)
	prefix = redistest.Prefix(t)
	pgA, pgB := openPG(t, url), openPG(t, url)
	t.Cleanup(pgA.Close)
	t.Cleanup(pgB.Close)
	a = startNodeWith(t, testConfig(), pgA, testLogger(), redisBroker(t, redistest.Addr, prefix))
	b = startNodeWith(t, testConfig(), pgB, testLogger(), redisBroker(t, redistest.Addr, prefix))
	return a, b, url, prefix
}

// Read requests have a rate of their own: a flood is refused, the others'
// requests go on.
func TestReadRequestRate(t *testing.T) {
	n := startNode(t, func(c *Config) { c.SignalRate, c.SignalBurst = 1, 3 })
	a, bob := n.dial(t, "alice"), n.dial(t, "bob")
	for i := 0; i < 3; i++ {
		a.send(`{"op":"read","room":"r","seq":0}`)
		a.expect(map[string]any{"op": "read", "seq": 0})
	}
	a.send(`{"op":"unread","rooms":["r"]}`)
	a.expect(map[string]any{"op": "err", "code": "rate_limited", "ref": ""})
	a.send(`{"op":"signal","room":"r","body":1}`) // signals have their own bucket
	a.send(`{"op":"ping"}`)
	a.expect(map[string]any{"op": "pong"})
	bob.send(`{"op":"read","room":"r","seq":0}`)
	bob.expect(map[string]any{"op": "read", "seq": 0})
}

// The Server API's read mark reaches the user's connections like a read.
func TestReadAPIReachesTabs(t *testing.T) {
	n := startNode(t, nil)
	alice, bob := n.dial(t, "alice"), n.dial(t, "bob")
	publish(t, bob, "r", "m", 2)
	seq, err := n.fan.MarkRead(context.Background(), "test/r", "alice", 2)
	if err != nil || seq != 2 {
		t.Fatal(seq, err)
	}
	alice.expect(map[string]any{"op": "read", "room": "r", "seq": 2})
}

// Signals are not replayed: a resume from 0 gets the messages only.
func TestSignalNotResumed(t *testing.T) {
	n := startNode(t, nil)
	a, bob := n.dial(t, "alice"), n.dial(t, "bob")
	joinAll("r", a, bob)
	a.send(`{"op":"signal","room":"r","body":1}`)
	bob.expect(map[string]any{"op": "signal"})
	a.send(`{"op":"pub","room":"r","id":"k","body":2}`)
	bob.expect(map[string]any{"op": "msg", "seq": 1})
	a.send(`{"op":"signal","room":"r","body":3}`)
	bob.expect(map[string]any{"op": "signal"})
	c := n.dial(t, "carol")
	c.send(`{"op":"join","room":"r","since":0}`)
	c.expect(map[string]any{"op": "joined"})
	c.expect(map[string]any{"op": "msg", "seq": 1})
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})
}

// An SSE stream of the user gets the user's read positions as "event:
// read" (no id: it moves no position of the stream), and with
// receipts=true the rooms' receipts as "event: receipts".
func TestReadAndReceiptsSSE(t *testing.T) {
	n := startNode(t, nil)
	bob := n.dial(t, "bob")
	publish(t, bob, "r", "m", 3)
	s := n.sse(t, "user=alice&app=test&room=r&receipts=true")
	s.expect("joined")
	id := s.lastID
	alice := n.dial(t, "alice")
	alice.send(`{"op":"read","room":"r","seq":2}`)
	alice.expect(map[string]any{"op": "read", "room": "r", "seq": 2})
	ev := s.expect("read")
	if ev.data != `{"op":"read","room":"r","seq":2}` || s.lastID != id {
		t.Fatalf("read event %+v, id %q (was %q)", ev, s.lastID, id)
	}
	// alice's own mark and bob's are the room's receipts.
	ev = s.expect("receipts")
	if ev.data != `{"op":"receipts","room":"r","read":{"alice":2}}` || s.lastID != id {
		t.Fatalf("receipts event %+v", ev)
	}
	bob.send(`{"op":"read","room":"r","seq":1}`) // his publishes moved it to 3: no news
	bob.expect(map[string]any{"op": "read", "seq": 3})
	carol := n.dial(t, "carol")
	carol.send(`{"op":"read","room":"r","seq":3}`)
	carol.expect(map[string]any{"op": "read", "seq": 3})
	ev = s.expect("receipts")
	if ev.data != `{"op":"receipts","room":"r","read":{"carol":3}}` {
		t.Fatalf("receipts event %+v", ev)
	}
	// A stream without receipts=true gets none, and nobody else's reads.
	s2 := n.sse(t, "user=dave&app=test&room=r")
	s2.expect("joined")
	carol.send(`{"op":"read","room":"r","seq":3}`)
	carol.expect(map[string]any{"op": "read", "seq": 3})
	bob.send(`{"op":"pub","room":"r","id":"after","body":1}`)
	bob.skipTo("ack")
	if ev := s2.expect("msg"); !strings.Contains(ev.data, `"seq":4`) {
		t.Fatalf("want msg 4, got %+v", ev)
	}
}

// A user's own publish moves its read position, and the move reaches the
// user's other connections on every node (once a second, coalesced), not
// the publishing one; it survives a node restart with PostgreSQL.
func TestOwnPublishReadReachesOtherNode(t *testing.T) {
	a, b, url, prefix := pgRedisNodes(t)
	aliceA, aliceA2, aliceB := a.dial(t, "alice"), a.dial(t, "alice"), b.dial(t, "alice")
	aliceB.send(`{"op":"ping"}`) // connected on b before the publishes
	aliceB.expect(map[string]any{"op": "pong"})
	publish(t, aliceA, "r", "m", 3)
	aliceB.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	aliceA2.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	// The publisher got its acks, and no read frame: its next frame is the pong.
	aliceA.send(`{"op":"ping"}`)
	aliceA.expect(map[string]any{"op": "pong"})
	// Never back, on either node.
	aliceB.send(`{"op":"read","room":"r","seq":1}`)
	aliceB.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	checkFor(t, 5*time.Second, func() bool {
		p, err := openPGRead(t, url, "test/r", "alice")
		return err == nil && p == 3
	})
	pgC := openPG(t, url)
	t.Cleanup(pgC.Close)
	c := startNodeWith(t, testConfig(), pgC, testLogger(), redisBroker(t, redistest.Addr, prefix))
	aliceC := c.dial(t, "alice")
	aliceC.send(`{"op":"read","room":"r","seq":0}`)
	aliceC.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
}

// A mark of a message another node published, delivered here, is taken
// without a store read on the positions goroutine (which every read mark
// and unread request of the node waits behind): the node's loop delivered
// that seq, so it is stored. A seq beyond what was delivered is still
// checked against the store, and refused when beyond the room's newest.
func TestReadOfDeliveredSeqAsksNoStore(t *testing.T) {
	a, b, _, _ := pgRedisNodes(t)
	aliceB := b.dial(t, "alice")
	joinAll("r", aliceB)
	bob := a.dial(t, "bob")
	publish(t, bob, "r", "m", 3)
	for seq := 1; seq <= 3; seq++ {
		aliceB.expect(map[string]any{"op": "msg", "seq": seq})
	}
	aliceB.send(`{"op":"read","room":"r","seq":3}`)
	aliceB.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	if n := b.fan.Stats.ReadMarksChecked.Load(); n != 0 {
		t.Fatalf("a mark of a delivered message read the store %d times, want 0", n)
	}
	aliceB.send(`{"op":"read","room":"r","seq":9}`)
	aliceB.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "r"})
	if n := b.fan.Stats.ReadMarksChecked.Load(); n != 1 {
		t.Fatalf("a mark beyond what was delivered read the store %d times, want 1", n)
	}
	// Not joined on b: b's loops delivered nothing of the room, and its
	// newest is read from the store once.
	publish(t, bob, "s", "m", 2)
	aliceB.send(`{"op":"read","room":"s","seq":2}`)
	aliceB.expect(map[string]any{"op": "read", "room": "s", "seq": 2})
	if n := b.fan.Stats.ReadMarksChecked.Load(); n != 2 {
		t.Fatalf("a mark in a room b never delivered read the store %d times in all, want 2", n)
	}
}

// openPGRead reads a position from the database through a store of its own.
func openPGRead(t *testing.T, url, key, user string) (uint64, error) {
	st := openPG(t, url)
	defer st.Close()
	return readPosition(st, key, user)
}

// readPosition is user's stored position in the room key.
func readPosition(st persist.Reads, key, user string) (uint64, error) {
	m := []persist.ReadMark{{Key: key, User: user}}
	err := st.ReadPositionsOf(context.Background(), m)
	return m[0].Seq, err
}

// Read marks are written by the group commit's transactions while
// publishes flow (the position's row carries a batch's transaction id),
// and on their own within about a second on an idle node.
func TestReadMarksInGroupCommitPostgres(t *testing.T) {
	a, _, url, _ := pgRedisNodes(t)
	ctx := context.Background()
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(ctx) })
	bob, alice := a.dial(t, "bob"), a.dial(t, "alice")
	publish(t, bob, "r", "m", 2)
	// Publishes keep coming into r (bob's reader only drains his acks);
	// alice keeps marking it read up to bob's latest: each second's mark
	// rides one of the publishes' commits.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			bob.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"o%d","body":1}`, i))
		}
	}()
	var inBatch bool
	checkFor(t, 10*time.Second, func() bool {
		time.Sleep(200 * time.Millisecond) // within alice's read rate
		var seq int64
		if db.QueryRow(ctx, `SELECT last_seq FROM rooms WHERE name = 'r'`).Scan(&seq) != nil {
			return false
		}
		alice.send(fmt.Sprintf(`{"op":"read","room":"r","seq":%d}`, seq)) // moves it: written again
		alice.skipTo("read")
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM read_positions rp JOIN messages m ON m.xmin::text = rp.xmin::text
WHERE rp.user_id = 'alice')`).Scan(&inBatch)
		return err == nil && inBatch
	})
	close(stop)
	<-done
	// Idle: no publish, a mark is still written within about a second.
	var last int64
	checkFor(t, 5*time.Second, func() bool {
		return db.QueryRow(ctx, `SELECT last_seq FROM rooms WHERE name = 'r'`).Scan(&last) == nil && last > 2
	})
	time.Sleep(300 * time.Millisecond) // the publishes' last acks and commits
	alice.send(fmt.Sprintf(`{"op":"read","room":"r","seq":%d}`, last))
	alice.skipTo("read")
	written := a.fan.Stats.ReadMarksWritten.Load()
	checkFor(t, 3*time.Second, func() bool {
		var seq int64
		err := db.QueryRow(ctx, `SELECT seq FROM read_positions WHERE user_id = 'alice'`).Scan(&seq)
		return err == nil && seq == last
	})
	checkFor(t, time.Second, func() bool { return a.fan.Stats.ReadMarksWritten.Load() > written })
}

// An app's registry entry sets its own signal and read-request limits;
// another app keeps the node's.
func TestChatLimitsPerApp(t *testing.T) {
	two, one := int64(2), int64(1)
	rate, slow := 1.0/3600, 0.0
	n := secureNode(t, nil,
		proto.App{ID: "a", Secret: secretA, Limits: proto.AppLimits{SignalRate: &rate, SignalBurst: &two, ReadRate: &rate, ReadBurst: &one}},
		proto.App{ID: "b", Secret: secretB, Limits: proto.AppLimits{ReadRate: &slow}})
	a, b := n.dialApp(t, "a", "alice"), n.dialApp(t, "b", "bob")
	for i := 0; i < 2; i++ {
		a.send(`{"op":"signal","room":"r","body":1}`)
	}
	a.send(`{"op":"signal","room":"r","body":1}`)
	a.expect(map[string]any{"op": "err", "code": "rate_limited", "ref": "r"})
	a.send(`{"op":"read","room":"r","seq":0}`)
	a.expect(map[string]any{"op": "read", "seq": 0})
	a.send(`{"op":"read","room":"r","seq":0}`)
	a.expect(map[string]any{"op": "err", "code": "rate_limited", "ref": "r"})
	// App b: the node's signal bucket (burst 20), no read limit.
	for i := 0; i < 20; i++ {
		b.send(`{"op":"signal","room":"r","body":1}`)
	}
	b.send(`{"op":"signal","room":"r","body":1}`)
	b.expect(map[string]any{"op": "err", "code": "rate_limited", "ref": "r"})
	for i := 0; i < 40; i++ {
		b.send(`{"op":"read","room":"r","seq":0}`)
		b.expect(map[string]any{"op": "read", "seq": 0})
	}
	if got := n.fan.Stats.SignalsLimited.Load(); got != 2 {
		t.Fatalf("signals limited %d, want 2", got)
	}
}

// Two nodes on PostgreSQL and Redis: the user's SSE stream on one node
// gets the read frames of the user's WebSocket on the other, and the
// position never moves back.
func TestReadSSETwoNodesPostgres(t *testing.T) {
	a, b, _, _ := pgRedisNodes(t)
	bob := a.dial(t, "bob")
	publish(t, bob, "r", "m", 4)
	s := b.sse(t, "user=alice&app=test&room=r")
	s.expect("joined")
	alice := a.dial(t, "alice")
	alice.send(`{"op":"read","room":"r","seq":3}`)
	alice.expect(map[string]any{"op": "read", "room": "r", "seq": 3})
	if ev := s.expect("read"); ev.data != `{"op":"read","room":"r","seq":3}` {
		t.Fatalf("read event %+v", ev)
	}
	alice.send(`{"op":"read","room":"r","seq":1}`)
	alice.expect(map[string]any{"op": "read", "room": "r", "seq": 3}) // not moved: nothing announced
	alice.send(`{"op":"read","room":"r","seq":4}`)
	alice.expect(map[string]any{"op": "read", "room": "r", "seq": 4})
	if ev := s.expect("read"); ev.data != `{"op":"read","room":"r","seq":4}` {
		t.Fatalf("read event %+v", ev)
	}
}
